"""Training throughput (tokens/s) of every positional scheme, fp32 vs bf16 autocast.

    python scripts/benchmark_throughput.py --model small --seq-len 128 --vocab 8192 --steps 10

Measures forward + backward + AdamW step of the bare GPT (no Lightning, no data loading) on
random tokens, after warm-up steps, and prints one row per scheme. On a GPU it also uses
torch.compile when --compile is given.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from poslab.build import build_model

REPO = Path(__file__).resolve().parents[1]
SCHEMES = ["nope", "learned", "sinusoidal", "rope", "alibi", "t5"]


def measure(scheme: str, args: argparse.Namespace, dtype: torch.dtype | None) -> float:
    config = {
        "model": OmegaConf.to_container(OmegaConf.load(REPO / f"conf/model/{args.model}.yaml")),
        "pos": OmegaConf.to_container(OmegaConf.load(REPO / f"conf/pos/{scheme}.yaml")),
    }
    config["model"]["dropout"] = 0.0
    if "max_positions" in config["pos"]:
        config["pos"]["max_positions"] = args.seq_len
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_model(config, args.vocab).to(device)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device)
    y = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return args.steps * x.numel() / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--schemes", nargs="+", default=SCHEMES)
    args = parser.parse_args()
    print(
        f"model={args.model} L={args.seq_len} batch={args.batch_size} vocab={args.vocab} "
        f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__}"
    )
    print("| scheme | fp32 tok/s | bf16 autocast tok/s | bf16 speed-up |")
    print("|---|---|---|---|")
    for scheme in args.schemes:
        fp32 = measure(scheme, args, None)
        bf16 = measure(scheme, args, torch.bfloat16)
        print(f"| {scheme} | {fp32:,.0f} | {bf16:,.0f} | {bf16 / fp32:.2f}× |", flush=True)


if __name__ == "__main__":
    main()

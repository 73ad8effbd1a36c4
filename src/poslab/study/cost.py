"""What a job costs, from its config alone: FLOPs (training, validation, evaluation), the memory
it needs on its device, and minutes at a given rate. The plan and the recipe's arithmetic
(docs/recipes.md) come from these functions, so the two cannot disagree.

FLOPs follow the usual count (Kaplan et al. 2020; PaLM's MFU appendix): a matmul parameter costs
2 FLOPs per token forward and 6 forward + backward; causal attention adds 2·T·d per layer and
token forward (QKᵀ and AV, half the square). Embedding lookups, norms and the positional scheme's
own arithmetic are left out: the MFU the runs report counts only this useful work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# activation bytes kept per layer, per token and model dimension, in 16-bit autocast with a fused
# attention kernel (Korthikanti et al. 2022: 34·s·b·h per layer without the s² term)
ACTIVATION_BYTES = 34
# weights, gradients and AdamW's two moments in fp32
STATE_BYTES_PER_PARAM = 16


@dataclass(frozen=True)
class Cost:
    matmul_params: int  # parameters in matmuls per token (layers + output head)
    params: int  # every parameter (the tied embedding once)
    train_tokens: int
    train_flops_per_token: float
    train_flops: float
    val_flops: float
    eval_flops: float
    memory_bytes: float  # the most the job holds on its device at once (an estimate)

    @property
    def flops(self) -> float:
        return self.train_flops + self.val_flops + self.eval_flops

    def seconds(self, rate: float, startup_s: float) -> float:
        """Wall seconds at `rate` useful FLOP/s (the device's share for this job)."""
        return self.flops / rate + startup_s


def vocab_of(config: dict[str, Any], plan: dict[str, Any]) -> int:
    """The vocabulary size: data.vocab_size where set (a cap), else the recipe's figure."""
    data = config["data"]
    given = data.get("vocab_size")
    if data.get("task"):
        return int(given or 64)
    return int(min(given, plan["vocab_size"]) if given else plan["vocab_size"])


def forward_flops_per_token(config: dict[str, Any], length: int, vocab: int) -> float:
    model = config["model"]
    return 2 * matmul_params(model, vocab) + 2 * model["n_layer"] * length * model["d_model"]


def matmul_params(model: dict[str, Any], vocab: int) -> int:
    d, layers = model["d_model"], model["n_layer"]
    return layers * (4 * d * d + 2 * d * model["d_ff"]) + d * vocab


def train_tokens_of(config: dict[str, Any]) -> int:
    """Tokens the run trains on: train.max_tokens where set, else steps × batch × L × accumulation
    × devices (a count of devices, else 1)."""
    trainer, data = config["trainer"], config["data"]
    if (config.get("train") or {}).get("max_tokens"):
        return int(config["train"]["max_tokens"])
    devices = trainer.get("devices")
    count = devices if isinstance(devices, int) and devices > 0 else 1
    per_step = data["batch_size"] * data["seq_len"] * trainer.get("accumulate_grad_batches", 1)
    return int(trainer["max_steps"]) * per_step * count


def eval_lengths_of(config: dict[str, Any]) -> list[int]:
    ev, seq_len = config["eval"], config["data"]["seq_len"]
    lengths = ev.get("lengths") or [int(f * seq_len) for f in ev["factors"]]
    return sorted({int(n) for n in lengths})


def scored_tokens(config: dict[str, Any], plan: dict[str, Any], trained: int) -> int:
    """Tokens scored at each evaluation length (eval.max_tokens; `auto` caps a short run at what
    it trained on, at least 65,536)."""
    split = int(plan["eval_tokens"])
    cap = config["eval"].get("max_tokens")
    if cap == "auto":
        return min(split, max(trained, 65536))
    return min(split, int(cap)) if cap else split


def evaluation_flops(config: dict[str, Any], ev: dict[str, Any], scored: int, vocab: int) -> float:
    """Forward FLOPs of one evaluation `ev` (an eval: block) of the model `config` over `scored`
    tokens per length: every mode at every length, and context use's short sliding pass."""
    flops = 0.0
    for length in eval_lengths_of({**config, "eval": ev}):
        for mode in ev["modes"]:
            # sliding windows overlap: each token is read length/stride times
            stride = ev.get("stride") or max(1, length // 2)
            passes = 1 if mode == "nonoverlapping" else length / stride
            flops += scored * passes * forward_flops_per_token(config, length, vocab)
    short = ev.get("short_context")
    if short and "nonoverlapping" in ev["modes"]:  # one sliding pass at c, stride c/2
        flops += scored * 2 * forward_flops_per_token(config, int(short), vocab)
    return flops


def with_overrides(ev: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """The eval: block `ev` with a study evaluation's `eval.key=value` overrides (YAML values);
    other keys are not the plan's concern."""
    import yaml

    ev = dict(ev)
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.startswith("eval.") and key.count(".") == 1:
            ev[key.split(".", 1)[1]] = yaml.safe_load(value) if value else None
    return ev


def job_cost(
    config: dict[str, Any], plan: dict[str, Any], evals: dict[str, list[str]] | None = None
) -> Cost:
    """The job's cost, its study's extra evaluations (`evals`: name -> overrides) included."""
    model, data, trainer = config["model"], config["data"], config["trainer"]
    vocab = vocab_of(config, plan)
    seq_len, d, layers = data["seq_len"], model["d_model"], model["n_layer"]
    matmul = matmul_params(model, vocab)
    per_token = 6 * matmul + 6 * layers * seq_len * d
    tokens = train_tokens_of(config)
    # validation: at step 0 and every val_check_interval steps, limit_val_batches batches of L
    steps = max(1, tokens // (data["batch_size"] * seq_len))
    interval = trainer.get("val_check_interval") or steps
    checks = 1 + steps // interval if isinstance(interval, int) else 2
    limit = trainer.get("limit_val_batches", 1.0)
    val_tokens = plan["eval_tokens"] if isinstance(limit, float) else limit * data["batch_size"]
    val_tokens = min(plan["eval_tokens"], val_tokens * (seq_len if isinstance(limit, int) else 1))
    val_flops = checks * val_tokens * forward_flops_per_token(config, seq_len, vocab)
    eval_flops = 0.0
    ev = config["eval"]
    if ev.get("after_train", True) and not data.get("task"):
        scored = scored_tokens(config, plan, tokens)
        eval_flops = evaluation_flops(config, ev, scored, vocab)
        for overrides in (evals or {}).values():
            other = with_overrides(ev, overrides)
            cap = scored_tokens({**config, "eval": other}, plan, tokens)
            eval_flops += evaluation_flops(config, other, cap, vocab)
    params = matmul + 4 * layers * d  # the embedding is the head's matrix (tied); + norms
    return Cost(
        matmul_params=matmul,
        params=params,
        train_tokens=tokens,
        train_flops_per_token=per_token,
        train_flops=per_token * tokens,
        val_flops=val_flops,
        eval_flops=eval_flops,
        memory_bytes=memory_bytes(config, params, vocab),
    )


def memory_bytes(config: dict[str, Any], params: int, vocab: int) -> float:
    """A generous estimate of the job's peak: the optimizer state, the activations of a training
    step, and the largest evaluation batch with one layer's attention scores in fp32 (what a
    kernel without a fused path materialises), plus a chunk of logits."""
    model, data = config["model"], config["data"]
    d, layers, heads = model["d_model"], model["n_layer"], model["n_head"]
    batch, seq_len = data["batch_size"], data["seq_len"]
    state = STATE_BYTES_PER_PARAM * params
    train = ACTIVATION_BYTES * batch * seq_len * d * layers + 4 * batch * heads * seq_len**2
    train += 6 * batch * seq_len * min(vocab, 8192)  # the loss's logits, in chunks
    longest = max([seq_len, *eval_lengths_of(config)])
    windows = config["eval"].get("batch_size") or max(1, 65536 // longest)
    evaluation = 4 * windows * heads * longest**2 + 6 * windows * longest * d * 4
    return state + max(train, evaluation)

"""`precision: auto`: bf16 autocast where the hardware runs bf16 natively, fp32 elsewhere.

GPUs say it themselves (`torch.cuda.is_bf16_supported`). CPUs do not: some run bf16 matmuls
natively (AMX, avx512_bf16: ~2.8× faster than fp32), others emulate them (3× to 100× *slower*).
A CPU whose flags (/proc/cpuinfo) lack both bf16 instruction sets gets fp32 at once; otherwise
(the flags say bf16, or cannot be read) we measure once per process: a few square matmuls in fp32
and in bf16, and bf16 must win by a margin, so that noise never picks the slower path.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from poslab.errors import ConfigError

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "32-true", "bf16-mixed", "16-mixed")
AUTOCAST_DTYPE = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
# bf16 must beat fp32 by this factor to be chosen: native bf16 is ~2-3× faster, emulated ~3×
# slower, so the margin only guards against timing noise on a busy machine
BF16_MARGIN = 1.15


def _matmul_gflops(dtype: torch.dtype, size: int = 384, repeats: int = 3) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)  # warm-up: first-call dispatch and oneDNN kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def cpu_has_bf16_instructions() -> bool | None:
    """True/False from the Linux CPU flags (AMX-BF16 or AVX512-BF16); None where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:
        return None
    return bool({"amx_bf16", "avx512_bf16"} & set(flags.split(":", 1)[-1].split()))


@functools.cache
def cpu_bf16_speedup() -> float:
    """bf16/fp32 matmul throughput ratio on this CPU, measured once per process (~0.1 s where
    bf16 is native); 0.0 without measuring when the CPU flags show no bf16 instructions."""
    if cpu_has_bf16_instructions() is False:
        return 0.0
    return _matmul_gflops(torch.bfloat16) / _matmul_gflops(torch.float32)


def resolve_precision(setting: str, device_type: str, key: str = "precision") -> str:
    """A Lightning precision string for `setting` (the config `key`) on `device_type`."""
    setting = str(setting)
    if setting not in PRECISIONS:
        raise ConfigError(f"{key}={setting!r}; choose one of {PRECISIONS}")
    if setting != "auto":
        return setting
    if device_type == "cuda":
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    if device_type != "cpu":
        return "32-true"
    speedup = cpu_bf16_speedup()
    choice = "bf16-mixed" if speedup >= BF16_MARGIN else "32-true"
    reason = (
        "no bf16 instructions in the CPU flags"
        if speedup == 0.0
        else f"bf16 matmuls measured at {speedup:.2f}× the fp32 speed"
    )
    log.info("precision=auto on this CPU: %s -> %s", reason, choice)
    return choice


def compute_dtype(default: torch.dtype, device_type: str) -> torch.dtype:
    """The dtype matmuls run in at this point: autocast's where it is on, else `default`."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def device_type_of(accelerator: str) -> str:
    """The device a Lightning `accelerator` setting will train on ("cpu" or "cuda")."""
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(accelerator)

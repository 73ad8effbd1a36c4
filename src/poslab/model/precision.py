"""`precision: auto`: bf16 autocast where the hardware runs bf16 natively, fp32 elsewhere.

GPUs say it themselves (`torch.cuda.is_bf16_supported`). CPUs do not: some run bf16 matmuls
natively (AMX, avx512_bf16: ~2× faster than fp32), others emulate them (3× to 100× *slower*).
The CPU flags (/proc/cpuinfo) decide where they can be read: bf16 instructions -> bf16-mixed,
none -> fp32. Only where they cannot be read (not Linux) is it measured: a few square matmuls in
fp32 and in bf16, and bf16 must win by a margin. A timing swings with the machine's load
(0.1×–4.3× was seen under load), so it is never what decides on Linux, and a run decides once:
a resumed run keeps the precision its checkpoint stored (`stored=`), whatever auto would say now.
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


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows of it."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def machine_name(device: torch.device, processes: int = 1) -> str:
    """What trained a model, for a run's record: the GPU's name, or the CPU's with the threads
    each process used (a CPU run's speed, and its bf16 kernels, depend on both)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        threads = torch.get_num_threads()
        name = f"{cpu_name()} ({threads} thread{'s' if threads != 1 else ''})"
    return f"{processes} × {name}" if processes > 1 else name


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
    bf16 is native). Used only where the CPU flags cannot be read."""
    return _matmul_gflops(torch.bfloat16) / _matmul_gflops(torch.float32)


def cpu_auto_precision() -> tuple[str, str]:
    """(precision, why) that `auto` picks on this CPU: the flags where they say, else a timing."""
    flags = cpu_has_bf16_instructions()
    if flags is True:
        return "bf16-mixed", "bf16 instructions (avx512_bf16/amx_bf16) in the CPU flags"
    if flags is False:
        return "32-true", "no bf16 instructions in the CPU flags"
    speedup = cpu_bf16_speedup()
    choice = "bf16-mixed" if speedup >= BF16_MARGIN else "32-true"
    return choice, f"CPU flags unreadable; bf16 matmuls measured at {speedup:.2f}× the fp32 speed"


def resolve_precision(
    setting: str, device_type: str, key: str = "precision", stored: str | None = None
) -> str:
    """A Lightning precision string for `setting` (the config `key`) on `device_type`. With
    `auto`, a precision a resumed run's checkpoint `stored` wins: one run, one precision."""
    setting = str(setting)
    if setting not in PRECISIONS:
        raise ConfigError(f"{key}={setting!r}; choose one of {', '.join(PRECISIONS)}")
    if setting != "auto":
        return setting
    if stored in PRECISIONS and stored != "auto":
        log.info("%s=auto: %s, the choice this run made when it started", key, stored)
        return str(stored)
    if device_type == "cuda":
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    if device_type != "cpu":
        return "32-true"
    choice, why = cpu_auto_precision()
    log.info("%s=auto on this CPU: %s -> %s", key, why, choice)
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

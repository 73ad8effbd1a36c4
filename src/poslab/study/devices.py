"""The devices a study can run on: this machine's GPUs (with the memory others use) or its CPU,
and each one's matmul rate, measured (the ceiling the plan's minutes and the runs' MFU use)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

from poslab.errors import ConfigError

# a GPU with more than this fraction of its memory in use runs someone else's work
BUSY_FRACTION = 0.1


@dataclass(frozen=True)
class Device:
    kind: str  # cuda | cpu
    index: int | None  # the GPU's index (CUDA_VISIBLE_DEVICES), None for the CPU
    name: str
    total_bytes: float
    used_bytes: float
    cores: int

    @property
    def label(self) -> str:
        return f"cuda:{self.index} ({self.name})" if self.kind == "cuda" else f"cpu ({self.name})"

    @property
    def free_bytes(self) -> float:
        return self.total_bytes - self.used_bytes


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpus() -> list[Device]:
    """This machine's CUDA GPUs, from nvidia-smi (no CUDA context in this process), else torch."""
    cores = cpu_cores()
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,name,memory.total,memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        found = []
        for line in out.strip().splitlines():
            index, name, total, used = (part.strip() for part in line.split(","))
            found.append(
                Device("cuda", int(index), name, float(total) * 2**20, float(used) * 2**20, cores)
            )
        return found
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        Device(
            "cuda",
            i,
            torch.cuda.get_device_name(i),
            float(torch.cuda.get_device_properties(i).total_memory),
            0.0,
            cores,
        )
        for i in range(torch.cuda.device_count())
    ]


def the_cpu() -> Device:
    from poslab.model.precision import cpu_name

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    return Device("cpu", None, cpu_name(), float(total), 0.0, cpu_cores())


def choose_devices(device: str, gpu_ids: list[int] | None) -> list[Device]:
    """The devices to run on: `device` auto (every free GPU, else the CPU), cuda or cpu;
    `gpu_ids` names GPUs to use whatever else runs on them. No device that can run the study is
    one line, before any work."""
    if device == "cpu":
        if gpu_ids:
            raise ConfigError("--gpus names GPUs but --device cpu runs on the CPU; drop one")
        return [the_cpu()]
    found = gpus()
    if gpu_ids:
        by_index = {d.index: d for d in found}
        unknown = [i for i in gpu_ids if i not in by_index]
        if unknown:
            present = ", ".join(str(i) for i in by_index) or "none"
            raise ConfigError(
                f"--gpus {unknown[0]}: no such GPU on this machine (present: {present})"
            )
        return [by_index[i] for i in gpu_ids]
    free = [d for d in found if d.used_bytes <= BUSY_FRACTION * d.total_bytes]
    if free:
        return free
    if found:
        busy = "; ".join(
            f"cuda:{d.index} {d.used_bytes / 2**30:.0f} of {d.total_bytes / 2**30:.0f} GiB in use"
            for d in found
        )
        raise ConfigError(
            f"no free GPU ({busy}); wait for them, name some with --gpus to share them, or "
            "run on the CPU with --device cpu"
        )
    if device == "cuda":
        raise ConfigError("--device cuda but this machine has no CUDA GPU; use --device cpu")
    return [the_cpu()]


def matmul_rate(device: Device, precision: str) -> float:
    """FLOP/s of a large matmul in the training precision on `device`, measured now (about a
    second). bf16 on a GPU: the ceiling an MFU is counted against."""
    import torch

    if device.kind == "cuda":
        dtype = torch.float32 if precision == "32-true" else torch.bfloat16
        size, repeats = 8192, 10
        with torch.cuda.device(device.index):
            a = torch.randn(size, size, device="cuda", dtype=dtype)
            b = torch.randn(size, size, device="cuda", dtype=dtype)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                a @ b
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / repeats
            del a, b
            torch.cuda.empty_cache()
        return 2 * size**3 / seconds
    from poslab.model.precision import _matmul_gflops

    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32
    return _matmul_gflops(dtype, size=1024, repeats=3) * 1e9

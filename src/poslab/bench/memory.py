"""Peak memory, measured in fresh processes forked from a server that has only imported torch and
poslab, one per measurement."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any

import torch

from poslab.bench.configs import scheme_config
from poslab.bench.timing import EvalJob, TrainJob, default_batch_tokens, make_setup, synthetic_split
from poslab.model.build import build_model

# the server is this command with --memory-server


def _rss_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {key} in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (VmHWM) of this process (Linux ≥ 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of one measurement (`spec["kind"]`: "train" = model, optimizer and two
    training steps at L; "eval" = model and one evaluation batch at 16·L), in bytes: on CUDA
    the peak of torch's allocator; on a CPU the growth of the peak resident set over the
    process's resident set before the model was built. Weights are included in both."""
    setup = make_setup(spec["precision"], spec["device"])
    torch.set_num_threads(spec["threads"])
    cuda = setup.device.type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.reset_peak_memory_stats(setup.device)
        base, exact = torch.cuda.memory_allocated(setup.device), True
    else:
        base, exact = _rss_status("VmRSS"), _reset_peak_rss()
    torch.manual_seed(0)
    config = scheme_config(
        spec["model"], spec["scheme"], spec["seq_len"], spec["max_len"], spec["attention"]
    )
    model = build_model(config, spec["vocab"]).to(setup.device)
    if spec["kind"] == "train":
        job = TrainJob(
            setup, model, model.loss, spec["batch"], spec["seq_len"], spec["vocab"], steps=2
        )
        job.run()  # two steps: the first allocates AdamW's moments, the second runs with them
    else:
        length = spec["max_len"]
        batch = max(1, default_batch_tokens(setup.device) // length)
        EvalJob(setup, model, synthetic_split(batch * length + 1, spec["vocab"]), length).run()
    setup.sync()
    peak = torch.cuda.max_memory_allocated(setup.device) if cuda else _rss_status("VmHWM")
    return {"bytes": peak - base, "exact": exact}


RESULT_MARK = "benchmark-memory-result "


class MemoryServer:
    """A process (this script with `--memory-server`) that imports torch and poslab once, then
    forks a fresh child for every measurement: seconds saved per measurement, and each child's
    allocations are its own. Started early, so that its imports overlap the model building.
    (multiprocessing's forkserver would do, but its children re-run the caller's main module.)"""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "poslab.bench", "--memory-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def measure(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(spec) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"error": "the memory server exited"}
        for line in self.proc.stdout:
            if line.startswith(RESULT_MARK):
                return json.loads(line[len(RESULT_MARK) :])
        return {"error": "the memory server exited"}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class InProcessMeasure:
    """On a GPU: every measurement in this process, one after another. torch's allocator resets
    its peak per measurement, so no fresh process is needed, and none can be forked: a process
    that has asked CUDA anything (even `torch.cuda.is_available()`) cannot use CUDA in a forked
    child ("Cannot re-initialize CUDA in forked subprocess", as the first GPU run showed)."""

    def measure(self, spec: dict[str, Any]) -> dict[str, Any]:
        try:
            return measure_memory(spec)
        except Exception as err:  # a measurement that fails is a table cell, not a crash
            return {"error": f"{type(err).__name__}: {err}"}
        finally:
            gc.collect()
            torch.cuda.empty_cache()

    def close(self) -> None:
        pass


def serve_memory() -> None:
    """The loop of MemoryServer's process: one JSON spec per stdin line, one forked child per
    spec, one result line on stdout. The server itself never computes (so no thread pool exists
    when it forks)."""
    import poslab.evaluation.perplexity  # noqa: F401  (the children evaluate; import it once)
    import poslab.run.lit  # noqa: F401  (the children's optimizer asks it; import it once here)

    for line in sys.stdin:
        spec = json.loads(line)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: measure, report, leave without running any exit handlers
            os.close(read_end)
            try:
                result = measure_memory(spec)
            except BaseException as err:
                result = {"error": f"{type(err).__name__}: {err}"}
            os.write(write_end, json.dumps(result).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        if data:
            result = json.loads(data)
        else:
            result = {"error": f"the measuring process died (wait status {status}; out of memory?)"}
        sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
        sys.stdout.flush()


def memory_cell(mem: dict[str, Any] | None) -> str:
    """A measurement as a table cell: MB, "(≤)" where it is an upper bound, or why it failed."""
    if not mem:
        return "—"
    if "error" in mem:
        return f"failed ({mem['error'][:60]})"
    return f"{mem['bytes'] / 1e6:,.0f} MB" + ("" if mem.get("exact", True) else " (≤)")

"""How many threads torch uses on a CPU: all the cores when the machine is idle, fewer when
other work already keeps some busy.

Measured on a 2-core Xeon with AMX (2026-12-06) with two training jobs already running: the
quick start's steps took 1,377 ms with torch's default 2 threads and 269 ms with one (5.1×);
idle, 2 threads are the faster. Threads that wait for a core another process holds stall every
parallel region of every op, so a busy machine is served by one thread per free core. The rule:
`OMP_NUM_THREADS` wins; otherwise, where other processes keep cores busy (measured over a quarter
of a second while this one sleeps: /proc/stat, else the 1-minute load average) so that fewer are
free than torch would use, torch gets the free cores (at least one) and the log says why and
how to choose.
"""

from __future__ import annotations

import logging
import os
import time

import torch

log = logging.getLogger(__name__)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _cpu_times() -> tuple[float, float] | None:
    """(idle, total) jiffies of all cores since boot, from /proc/stat (None elsewhere)."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0.0), sum(fields)


def busy_cores(cores: int, window_s: float = 0.25) -> float:
    """How many cores other processes keep busy: the busy share of the machine's time over
    `window_s` while this process sleeps, times its cores (the 1-minute load average where there
    is no /proc/stat)."""
    first = _cpu_times()
    if first is None:
        try:
            return os.getloadavg()[0]
        except OSError:
            return 0.0
    time.sleep(window_s)
    second = _cpu_times()
    if second is None or second[1] <= first[1]:
        return 0.0
    idle = (second[0] - first[0]) / (second[1] - first[1])
    # /proc/stat counts every core of the machine; this process may use only some of them
    machine = os.cpu_count() or cores
    return max(0.0, (1.0 - idle) * machine - (machine - cores))


def choose_threads(device: str = "cpu") -> int:
    """Set torch's intra-op threads for this process by the rule above; returns the count and
    logs one line saying what it is and why."""
    if os.environ.get("OMP_NUM_THREADS"):
        count = torch.get_num_threads()
        log.info("torch threads: %d (OMP_NUM_THREADS)", count)
        return count
    count = torch.get_num_threads()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cpu":
        log.info("torch threads: %d", count)
        return count
    cores = usable_cores()
    load = busy_cores(cores)
    free = max(1, int(cores - load + 0.5))
    if free < count:
        torch.set_num_threads(free)
        log.info(
            "torch threads: %d, not %d: other work keeps %.1f of %d cores busy, and threads "
            "waiting for a busy core slow every step several-fold; OMP_NUM_THREADS=N chooses",
            free,
            count,
            load,
            cores,
        )
        return free
    log.info("torch threads: %d (OMP_NUM_THREADS=N chooses)", count)
    return count

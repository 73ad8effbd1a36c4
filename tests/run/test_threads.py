"""poslab/run/threads.py: torch's threads follow the free cores unless OMP_NUM_THREADS says."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import REPO

CHOOSE = (
    "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout); "
    "import torch; torch.set_num_threads({start}); "
    "from poslab.run.threads import choose_threads; print('chosen', choose_threads('cpu'))"
)


def chosen(start: int, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", CHOOSE.format(start=start)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split("chosen")[-1]), done.stdout


def test_omp_num_threads_wins():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    count, text = chosen(1, env)
    assert count == 1 and "torch threads: 1 (OMP_NUM_THREADS)" in text


@pytest.mark.slow  # starts processes
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads /proc/stat")
def test_busy_cores_take_threads_away_and_the_log_says_why():
    from poslab.run.threads import usable_cores

    cores = usable_cores()
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    # every core kept busy by another process: one thread, and a line that says why
    spin = "import time\nend = time.time() + 20\nwhile time.time() < end: pass\n"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    try:
        time.sleep(1.0)
        count, text = chosen(cores, env)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert count == 1, text
    assert f"torch threads: 1, not {cores}: other work keeps" in text
    assert "OMP_NUM_THREADS=N chooses" in text

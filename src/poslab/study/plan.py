"""The plan of a study, printed before any work: each job's cost, how many jobs share a device,
and the minutes it should take here and on the recipe's reference device."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from poslab.errors import ConfigError
from poslab.study.cost import Cost, job_cost
from poslab.study.devices import Device
from poslab.study.recipe import Job, Study

# at most this many jobs share one GPU (each also takes CPU cores for its data and Python)
MAX_JOBS_PER_GPU = 4
# a job may plan on this fraction of a device's free memory
MEMORY_MARGIN = 0.9


@dataclass
class PlannedJob:
    job: Job
    cost: Cost
    done_fraction: float = 0.0  # of its FLOPs, from a checkpoint of a cut-off run
    finished: bool = False

    @property
    def flops_left(self) -> float:
        return 0.0 if self.finished else self.cost.flops * (1 - self.done_fraction)


@dataclass
class Plan:
    study: Study
    jobs: list[PlannedJob]
    devices: list[Device]
    rate: float  # measured matmul FLOP/s of one device, in the training precision
    precision: str
    slots: int  # jobs at a time per device
    mfu: float
    minutes: float = 0.0
    reference_minutes: float | None = None
    order: list[PlannedJob] = field(default_factory=list)


def slots_per_device(
    jobs: list[PlannedJob], device: Device, wanted: int | None, n_devices: int
) -> int:
    """Jobs at a time on one device: `wanted`, or as many as its free memory holds (at most
    MAX_JOBS_PER_GPU, and two CPU cores each); the CPU runs one at a time unless told."""
    need = max((p.cost.memory_bytes for p in jobs if not p.finished), default=0.0)
    free = device.free_bytes * MEMORY_MARGIN
    if device.kind == "cuda" and need > free:
        heaviest = max(jobs, key=lambda p: p.cost.memory_bytes).job.name
        raise ConfigError(
            f"job {heaviest} needs about {need / 2**30:.1f} GiB, more than the "
            f"{free / 2**30:.1f} GiB free on {device.label}; lower data.batch_size or "
            "eval.batch_size"
        )
    if wanted is not None:
        return wanted
    if device.kind == "cpu":
        return 1
    by_memory = int(free // need) if need else MAX_JOBS_PER_GPU
    by_cores = max(1, device.cores // (2 * n_devices))
    return max(1, min(MAX_JOBS_PER_GPU, by_memory, by_cores))


def estimated_minutes(
    jobs: list[PlannedJob], devices: int, slots: int, rate: float, startup_s: float
) -> tuple[float, list[PlannedJob]]:
    """Minutes until the last job ends. Longest jobs first, up to `slots` at a time per device;
    a job first spends `startup_s` off the device (imports, data), then computes, sharing its
    device's `rate` equally with the other jobs computing there."""
    order = sorted((p for p in jobs if not p.finished), key=lambda p: -p.flops_left)
    queue = list(order)
    # per device: [startup seconds left or FLOPs left, phase] of each job on it
    running: list[list[list[float]]] = [[] for _ in range(devices)]
    now = 0.0
    while queue or any(running):
        for jobs_on in running:
            while queue and len(jobs_on) < slots:
                jobs_on.append([startup_s, 0.0, queue.pop(0).flops_left])
        step = math.inf
        for jobs_on in running:
            computing = sum(j[0] <= 0 for j in jobs_on)
            for job in jobs_on:
                left = job[0] if job[0] > 0 else job[2] / (rate / computing)
                step = min(step, left)
        now += step
        for jobs_on in running:
            computing = sum(j[0] <= 0 for j in jobs_on)
            for job in jobs_on:
                if job[0] > 0:
                    job[0] -= step
                else:
                    job[2] -= step * rate / computing
            jobs_on[:] = [j for j in jobs_on if j[0] > 1e-9 or j[2] > 1e-6 * rate]
    return now / 60, order


def make_plan(
    study: Study,
    devices: list[Device],
    rate: float,
    precision: str,
    wanted_slots: int | None,
    progress: dict[str, float],
) -> Plan:
    """`progress`: each job's done fraction (1.0: finished) from its run folder."""
    jobs = []
    for job in study.jobs:
        done = progress.get(job.name, 0.0)
        jobs.append(
            PlannedJob(job, job_cost(job.config, study.plan, study.evals), done, done >= 1.0)
        )
    on_gpu = devices[0].kind == "cuda"
    mfu = study.plan["mfu"] if on_gpu else study.plan["cpu_mfu"]
    slots = slots_per_device(jobs, devices[0], wanted_slots, len(devices))
    startup = study.plan["startup_s"]
    minutes, order = estimated_minutes(jobs, len(devices), slots, rate * mfu, startup)
    reference = study.reference
    reference_minutes = None
    if reference.get("matmul_flops"):
        ref_devices = int(reference.get("devices") or 1)
        ref_slots = MAX_JOBS_PER_GPU if wanted_slots is None else wanted_slots
        reference_minutes, _ = estimated_minutes(
            jobs,
            ref_devices,
            ref_slots,
            float(reference["matmul_flops"]) * study.plan["mfu"],
            startup,
        )
    return Plan(
        study, jobs, devices, rate, precision, slots, mfu, minutes, reference_minutes, order
    )


def _si(value: float) -> str:
    for unit, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def plan_text(plan: Plan, out: Any, launcher: str) -> str:
    study = plan.study
    finished = sum(p.finished for p in plan.jobs)
    cut = sum(0 < p.done_fraction < 1 for p in plan.jobs)
    lines = [
        f"study {study.name}: {len(plan.jobs)} job{'s' if len(plan.jobs) != 1 else ''} of "
        f"experiment={study.experiment} "
        f"({finished} finished, {cut} to resume, {len(plan.jobs) - finished - cut} to start) "
        f"-> {out}",
        "",
        "| job | L | params | train tokens | epochs* | PFLOP | memory | done |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    corpus = study.plan.get("corpus_tokens")
    for p in plan.jobs:
        config, cost = p.job.config, p.cost
        epochs = f"{cost.train_tokens / corpus:.1f}" if corpus else "—"
        lines.append(
            f"| {p.job.name} | {config['data']['seq_len']} | {_si(cost.params)} | "
            f"{_si(cost.train_tokens)} | {epochs} | {cost.flops / 1e15:.2f} | "
            f"{cost.memory_bytes / 2**30:.1f} GiB | {p.done_fraction:.0%} |"
        )
    if corpus:
        lines.append(f"\n*epochs of the {corpus:,}-token training split (plan.corpus_tokens)")
    else:
        lines.append("\n*epochs: give the training split's tokens as plan.corpus_tokens")
    total = sum(p.flops_left for p in plan.jobs)
    lines.append("")
    if launcher == "local":
        names = ", ".join(d.label for d in plan.devices)
        lines.append(
            f"devices: {names}; matmul {_si(plan.rate)}FLOP/s measured ({plan.precision}); "
            f"{plan.slots} job(s) at a time per device"
        )
        lines.append(
            f"estimate: {plan.minutes:.1f} min for {_si(total)}FLOP left, at an assumed MFU of "
            f"{plan.mfu:.2f} shared by a device's jobs, plus {study.plan['startup_s']:g} s of "
            "start-up per job"
        )
        hours = sum(
            p.flops_left / (plan.rate * plan.mfu / plan.slots) + study.plan["startup_s"]
            for p in plan.jobs
            if not p.finished
        )
        per_device = plan.devices[0].cores // plan.slots if plan.devices[0].kind == "cpu" else 0
        threads = f" of {per_device} thread{'s' if per_device != 1 else ''}" if per_device else ""
        lines.append(
            f"job-hours: {hours / 3600:.1f} (each job's time in its slot{threads}, summed)"
        )
    else:
        lines.append(f"launcher: {launcher} (one job of the cluster per study job)")
    if plan.reference_minutes is not None:
        ref = study.reference
        budget = f" (the recipe's budget: {ref['minutes']:g} min)" if ref.get("minutes") else ""
        lines.append(
            f"on the recipe's reference device, {ref.get('name', 'a GPU')} "
            f"({_si(float(ref['matmul_flops']))}FLOP/s, MFU {study.plan['mfu']:.2f}): "
            f"{plan.reference_minutes:.1f} min{budget}"
        )
    return "\n".join(lines)


def check_budget(plan: Plan, budget: float | None, launcher: str = "local") -> None:
    """A plan estimated above `budget` minutes is refused: on this machine's devices, or with a
    cluster launcher on the recipe's reference device (the only estimate it prints)."""
    if budget is None:
        return
    minutes, where = plan.minutes, "on these devices"
    if launcher not in ("local", "submitit_local"):
        if plan.reference_minutes is None:
            raise ConfigError(
                f"--budget with --launcher {launcher} reads the recipe's reference device, and "
                "this recipe names none (reference.matmul_flops); drop --budget"
            )
        minutes, where = plan.reference_minutes, "on the recipe's reference device"
    if minutes <= budget:
        return
    raise ConfigError(
        f"the plan needs about {math.ceil(minutes)} min {where}, more than --budget "
        f"{budget:g}; raise --budget, run on more or faster devices, or give a smaller recipe "
        "(trainer.max_steps=, model=)"
    )

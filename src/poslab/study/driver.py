"""Run every job of a study: `python scripts/study.py RECIPE [key=value ...] [options]`.

Each job is `python train.py experiment=<recipe's> <your overrides> <job overrides>` in its own
folder, <out>/runs/<job>/, with `resume=auto`: a job that finished is skipped, one that was cut
off (a time limit, a kill, a lost node) continues from its last checkpoint, so running the same
command again resumes the study. Jobs run several at a time on one GPU where their memory fits,
on every free GPU of the machine (`--device`, `--gpus`), one at a time on a CPU
(`--jobs-per-device`), or as SLURM jobs through Hydra's submitit launcher (`--launcher
submitit_slurm`, with `hydra.launcher.*=` overrides). The plan (jobs, devices, minutes) is printed
before any work; `--dry-run` stops there. Each finished job is recorded at once in
<out>/study.json; at the end (also after `--time-limit`, SIGTERM or Ctrl-C) <out>/comparison/
holds compare.py's merged table (mean ± sd, paired 95% intervals against the recipe's baseline,
the paper's shape checks, figures) and <out>/study.md the per-job throughput and MFU and every
job without a result. Bad input (an unknown recipe or option, a budget the plan cannot meet, no
free device, a folder whose runs were made with other settings, a second driver on one study) is
one `error:` line before any work. Exit codes: 0 every job has a result, 1 some have none (a
failed job, a time limit), 2 bad input, 130/143 stopped by SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from poslab.arguments import OneLineParser, a_path, check_writable
from poslab.errors import ConfigError, RunBusy, exit_on_config_error
from poslab.run.run_folder import RunLock
from poslab.study.folders import (
    check_no_job_running,
    check_runs_match,
    eval_folder,
    evals_missing,
    job_status,
    progress_of,
    run_folder,
)
from poslab.study.plan import Plan, PlannedJob, check_budget, make_plan, plan_text
from poslab.study.recipe import Study, compose_jobs, load_study

LAUNCHERS = ("local", "submitit_local", "submitit_slurm")
STATE_FILE = "study.json"
POLL_S = 0.2
# how long a stopped job may take to save its checkpoint before it is killed (a training step and
# a save; a job stopped in its first validation finishes that first)
STOP_GRACE_S = 90


@dataclass
class Running:
    planned: PlannedJob
    process: subprocess.Popen
    device: Any
    started: float
    log: Any
    evaluation: str | None = None  # the study's evaluation this process runs; None: training


def eval_command(
    study: Study, evaluation: str, overrides: list[str], folder: Path, out: Path
) -> list[str]:
    """eval.py on a finished job's run folder, with the recipe's `evals.<evaluation>` overrides;
    of the study's own overrides only those eval.py reads too (data_path)."""
    given = [o for o in overrides if o.startswith("data.path=")]
    data = [f"data_path={o.split('=', 1)[1]}" for o in given]
    return [
        sys.executable,
        "-m",
        "poslab.apps.evaluate",
        f"run={folder}",
        f"out_dir={out}",
        *data,
        *study.evals[evaluation],
    ]


def job_command(
    study: Study, job_overrides: list[str], overrides: list[str], folder: Path, launcher: str
) -> list[str]:
    base = [sys.executable, "-m", "poslab.apps.train"]
    # a job's own overrides come last: they define it (its scheme, seed, length), and win
    common = [f"experiment={study.experiment}", *overrides, *job_overrides, "resume=auto"]
    if launcher == "local":
        return [*base, *common, f"hydra.run.dir={folder}", "trainer.enable_progress_bar=false"]
    # one Hydra multirun of one job, handed to the cluster; its folder is the same as locally
    return [
        *base,
        "-m",
        *common,
        f"hydra/launcher={launcher}",
        f"hydra.sweep.dir={folder.parent}",
        f"hydra.sweep.subdir={folder.name}",
        "~hydra.callbacks.compare",  # the study compares once, at its end
        "trainer.enable_progress_bar=false",
    ]


class StudyState:
    """<out>/study.json: the command, the devices, and each job's state, written at every change
    (atomically), so that a study cut off anywhere says what finished."""

    def __init__(self, out: Path, study: Study, overrides: list[str], launcher: str) -> None:
        self.path = out / STATE_FILE
        self.data: dict[str, Any] = {
            "recipe": study.name,
            "source": str(study.source.resolve()),
            "source_sha256": recipe_digest(study.source),
            "experiment": study.experiment,
            "overrides": overrides,
            "launcher": launcher,
            "jobs": {j.name: {"overrides": j.overrides, "state": "pending"} for j in study.jobs},
        }
        from poslab.report.provenance import code_version

        # the code this invocation's jobs run (a study resumed later may run another: each job
        # records its own too, in its rows' provenance)
        self.data["code"] = code_version()
        if self.path.is_file():
            old = json.loads(self.path.read_text())
            for name, entry in old.get("jobs", {}).items():
                if name not in self.data["jobs"]:  # another chunk's job (--only): kept as it was
                    self.data["jobs"][name] = entry
                    continue
                self.data["jobs"][name].update(
                    {k: v for k, v in entry.items() if k in ("wall_s", "invocations", "code")}
                )

    def job(self, name: str) -> dict[str, Any]:
        return self.data["jobs"][name]

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(self.data, indent=1))
        os.replace(temporary, self.path)


def check_same_study(out: Path, study: Study) -> None:
    """A folder that holds a study resumes only that recipe (its runs' settings are checked job
    by job: folders.check_runs_match); a folder that holds something else is not written into."""
    path = out / STATE_FILE
    if not path.is_file():
        if out.is_dir() and any(p.name != ".lock" for p in out.iterdir()):
            raise ConfigError(
                f"--out {out} is a folder that holds no study ({STATE_FILE}); pass an empty or "
                "new folder"
            )
        return
    try:
        old = json.loads(path.read_text())
    except ValueError:
        old = None
    # a hand-edited file: every job's entry is read when the study resumes
    jobs = (old.get("jobs") or {}) if isinstance(old, dict) else None
    if not isinstance(jobs, dict) or not all(isinstance(e, dict) for e in jobs.values()):
        raise ConfigError(f"{path} cannot be read; remove it or pass another --out")
    if old.get("recipe") != study.name:
        raise ConfigError(
            f"{out} holds the study {old.get('recipe')!r}, not {study.name!r}; resume that one "
            "there, or pass another --out for a new study"
        )
    if not same_recipe(old, study.source):
        raise ConfigError(
            f"{out} holds the study made by {old.get('source')}, not by {study.source} (another "
            f"recipe named {study.source.name}); resume it with that file, or pass another --out"
        )


def recipe_digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def same_recipe(old: dict[str, Any], source: Path) -> bool:
    """Whether study.json's recipe is the file `source`: the same path, or the same bytes (a
    moved checkout, a copied recipe). Only the name was compared once, so a .yaml elsewhere
    named like it resumed the folder and its report forgot the first recipe's runs. (A recipe
    edited in place keeps its path: check_runs_match compares its jobs' settings.)"""
    recorded = old.get("source")
    if recorded is None:  # a study.json older than the field: nothing to compare
        return True
    if Path(recorded).resolve() == source.resolve():
        return True
    digest = old.get("source_sha256")
    if digest is None and Path(recorded).is_file():
        digest = recipe_digest(Path(recorded))
    return digest == recipe_digest(source)


class Driver:
    def __init__(
        self,
        plan: Plan,
        out: Path,
        overrides: list[str],
        launcher: str,
        deadline: float | None,
        resume_line: str,
    ) -> None:
        self.plan, self.out, self.overrides, self.launcher = plan, out, overrides, launcher
        self.deadline, self.resume_line = deadline, resume_line
        self.state = StudyState(out, plan.study, overrides, launcher)
        self.running: list[Running] = []
        self.stop_reason: str | None = None
        self.hurry = False
        self.started = time.monotonic()

    # -- signals: stop launching, let running jobs save a checkpoint, then report ------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_reason is not None:  # a second signal: kill the jobs now
            self.hurry = True
            return
        self.stop_reason = signal.Signals(signum).name

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self._run()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        return self.report()

    def _slots(self) -> list[Any]:
        if self.launcher == "submitit_local":  # this machine: as many at a time as told
            return [None] * self.plan.slots
        if self.launcher != "local":  # the cluster queues them
            return [None] * len(self.plan.order)
        return [d for d in self.plan.devices for _ in range(self.plan.slots)]

    def _run(self) -> None:
        self.queue = queue = list(self.plan.order)
        for planned in self.plan.jobs:
            if planned.finished:
                self.state.job(planned.job.name)["state"] = "completed"
        self.state.write()
        free = self._slots()
        total = len(queue)
        done = 0
        while queue or self.running:
            if (
                self.deadline is not None
                and time.monotonic() >= self.deadline
                and not self.stop_reason
            ):
                self.stop_reason = "the time limit"
            if self.stop_reason:
                queue = []
                self._stop_running()
            while queue and free:
                self._start(queue.pop(0), free.pop(0))
            for entry in list(self.running):
                code = entry.process.poll()
                if code is None:
                    continue
                self.running.remove(entry)
                free.append(entry.device)
                done += 1
                if self._finished(entry, code, done, total):
                    done -= 1
            time.sleep(POLL_S)

    def _start(self, planned: PlannedJob, device: Any) -> None:
        name = planned.job.name
        folder = run_folder(self.out, name)
        folder.parent.mkdir(parents=True, exist_ok=True)
        (self.out / "logs").mkdir(exist_ok=True)
        log = open(self.out / "logs" / f"{name}.log", "a")  # noqa: SIM115 (closed when it ends)
        trained = job_status(self.out, name).get("status") == "completed"
        evaluation = None
        if trained and (missing := evals_missing(self.out, self.plan.study, name)):
            # training finished earlier (or just now): the study's next evaluation of it
            evaluation = missing[0]
            command = eval_command(
                self.plan.study,
                evaluation,
                self.overrides,
                folder,
                eval_folder(self.out, evaluation, name),
            )
        else:
            command = job_command(
                self.plan.study, planned.job.overrides, self.overrides, folder, self.launcher
            )
        env = dict(os.environ)
        # one W&B group for the study's runs and its comparison (a user's WANDB_RUN_GROUP wins)
        env.setdefault("WANDB_RUN_GROUP", self.study_group)
        if self.launcher == "local":
            slots = len(self._slots())
            cores = max(1, self.plan.devices[0].cores // slots)
            env["OMP_NUM_THREADS"] = str(cores)
            env["CUDA_VISIBLE_DEVICES"] = "" if device.kind == "cpu" else str(device.index)
        log.write(f"\n$ {shlex.join(command)}\n")
        log.flush()
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        entry = self.state.job(name)
        entry.update(
            state="running",
            pid=process.pid,
            run=str(folder),
            device=getattr(device, "label", self.launcher),
        )
        entry["invocations"] = entry.get("invocations", 0) + 1
        entry.setdefault("code", self.state.data["code"])  # where its training started
        self.state.write()
        self.running.append(Running(planned, process, device, time.monotonic(), log, evaluation))
        where = f" on {device.label}" if device is not None else ""
        resumed = " (resumed)" if planned.done_fraction > 0 and not evaluation else ""
        what = f" (evaluation {evaluation})" if evaluation else ""
        print(f"started {name}{what}{resumed}{where}", flush=True)

    def _finished(self, entry: Running, code: int, done: int, total: int) -> bool:
        """Record a process that ended; True where the job was queued again (an evaluation
        of the study follows its training or its last evaluation)."""
        entry.log.close()
        name = entry.planned.job.name
        status = job_status(self.out, name)
        state = self.state.job(name)
        wall = time.monotonic() - entry.started
        state["wall_s"] = state.get("wall_s", 0.0) + wall
        state["returncode"] = code
        state.pop("pid", None)
        missing = evals_missing(self.out, self.plan.study, name)
        evaluated = entry.evaluation is None or entry.evaluation not in missing
        requeued = False
        if status.get("status") == "completed" and evaluated and missing and not self.stop_reason:
            # its next evaluation runs next, in the slot it frees (first in the queue)
            state["state"] = "evaluating"
            self.queue.insert(0, entry.planned)
            requeued = True
            what = "trained" if entry.evaluation is None else f"evaluation {entry.evaluation}"
            line = f"{name}: {what} in {wall / 60:.1f} min; evaluation {missing[0]} next"
        elif status.get("status") == "completed" and evaluated and not missing:
            state["state"] = "completed"
            loss = status.get("best_val_loss")
            said = f", best val loss {loss:.4f}" if isinstance(loss, float) else ""
            line = f"[{done}/{total}] {name} completed in {_spent(state, entry, wall)}{said}"
        elif status.get("status") == "completed" and (evaluated or self.stop_reason):
            state["state"] = "evaluating"
            state["why"] = f"stopped by {self.stop_reason} before evaluation {missing[0]}"
            line = f"[{done}/{total}] {name} has no result ({state['why']})"
        elif status.get("status") == "completed":
            state["state"] = "failed"
            why = last_error_line(self.out / "logs" / f"{name}.log") or f"exit code {code}"
            state["why"] = f"evaluation {entry.evaluation}: {why}"
            log = f"{self.out}/logs/{name}.log"
            line = f"[{done}/{total}] {name} has no result ({state['why']}); log: {log}"
        else:
            given = status.get("status")
            state["state"] = (
                given
                if given in ("interrupted", "failed")
                else ("killed" if code < 0 else "failed")
            )
            why = (
                status.get("error")
                or last_error_line(self.out / "logs" / f"{name}.log")
                or (
                    f"stopped by {self.stop_reason}"
                    if self.stop_reason
                    else f"killed by signal {-code}"
                    if code < 0
                    else f"exit code {code}"
                )
            )
            state["why"] = why
            line = f"[{done}/{total}] {name} has no result ({why}); log: {self.out}/logs/{name}.log"
        self.state.write()
        print(line, flush=True)
        return requeued

    def _stop_running(self) -> None:
        """SIGTERM to every running job (each saves last.ckpt and exits), then wait."""
        if not self.running:
            return
        print(
            f"stopping {len(self.running)} running job(s) ({self.stop_reason}): each saves "
            "a checkpoint",
            flush=True,
        )
        for entry in self.running:
            if entry.process.poll() is None:
                os.killpg(entry.process.pid, signal.SIGTERM)
        limit = time.monotonic() + STOP_GRACE_S
        while (
            any(e.process.poll() is None for e in self.running)
            and time.monotonic() < limit
            and not self.hurry
        ):
            time.sleep(POLL_S)
        for entry in self.running:
            if entry.process.poll() is None:
                os.killpg(entry.process.pid, signal.SIGKILL)
                entry.process.wait()

    # -- the end: the merged table, throughput, what is missing ------------------------------
    @property
    def study_group(self) -> str:
        """The W&B group of the study's jobs and comparison, unless WANDB_RUN_GROUP or
        logger.group names one (tracking.wandb_group)."""
        return f"study-{self.out.name}"

    def _log_comparison(self, missing: list[str]) -> None:
        """The merged comparison once in W&B, in the jobs' group, where the jobs log to W&B and
        every job has its result (a stopped or partial study logs nothing: its next run will)."""
        from poslab.run.tracking import log_comparison, uses_wandb, wandb_group

        loggers = [p.job.config.get("logger") for p in self.plan.jobs]
        logger = next((lg for lg in loggers if uses_wandb(lg)), None)
        if logger is None or missing or self.stop_reason:
            return
        group = wandb_group(logger, self.study_group)
        name = self.plan.study.name
        if folder := log_comparison(self.out / "comparison", logger, group, name):
            print(f"logged the comparison to W&B, group {group}: {folder}", flush=True)

    def report(self) -> int:
        from poslab.study.report import write_report

        minutes = (time.monotonic() - self.started) / 60
        missing = write_report(self.plan, self.out, self.state.data, minutes, self.resume_line)
        self._log_comparison(missing)
        if self.stop_reason:
            print(
                f"study stopped by {self.stop_reason}; resume it with: {self.resume_line}",
                file=sys.stderr,
                flush=True,
            )
            if self.stop_reason in ("SIGINT", "SIGTERM"):
                return 128 + signal.Signals[self.stop_reason].value
        return 1 if missing else 0


def _spent(state: dict[str, Any], entry: Running, wall: float) -> str:
    """A finished job's time over all its processes (training and each evaluation), not the
    last one's alone: an evaluation of ~2 min read as a 21-minute job's time."""
    spent = f"{state['wall_s'] / 60:.1f} min"
    if entry.evaluation is not None:
        spent += f" (evaluation {entry.evaluation} the last {wall / 60:.1f})"
    return spent


def last_error_line(log: Path) -> str | None:
    """The job's own one-line error (train.py's `error: ...`), the last in its log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line[len("error: ") :] for line in lines if line.startswith("error: ")]
    return errors[-1] if errors else None


def default_out(study: Study) -> Path:
    return Path("outputs") / "studies" / study.name


def parse(argv: list[str] | None) -> Any:
    """The command line, each option checked (one line for a bad one)."""
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)  # overrides before or after the options
    check_args(parser, args)
    return args


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="scripts/study.py",
        description=__doc__.split("\n\n")[0],
        epilog="Exit codes: 0 every job has a result, 1 some have none (see <out>/study.md), "
        "2 bad input, 130/143 stopped by SIGINT/SIGTERM (the same command resumes).",
    )
    parser.add_argument("recipe", help="a study of conf/study/ (paper_gpu, ...) or a .yaml file")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="overrides for every job (data.path=DIR, trainer.max_steps=N, ...)",
    )
    parser.add_argument(
        "--out",
        default=None,
        type=a_path,
        help="the study's folder (default outputs/studies/<recipe>); the same "
        "command again resumes it",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="GLOB",
        help="run only the jobs whose names match (shell pattern, repeatable), e.g. "
        "--only '*-s1234-*': a chunk of a study too long for one sitting",
    )
    _add_placement(parser)
    return parser


def _add_placement(parser: OneLineParser) -> None:
    """The options of where and how long the jobs run."""
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="auto: every free GPU, else the CPU",
    )
    parser.add_argument(
        "--gpus", default=None, help="GPU indices to use, e.g. 0,1 (even if others use them)"
    )
    parser.add_argument(
        "--jobs-per-device",
        type=int,
        default=None,
        help="jobs at a time on one device (default: as many as memory holds on "
        "a GPU, at most 4; 1 on a CPU)",
    )
    parser.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="local",
        help="local: this machine; submitit_slurm: one SLURM job per study job "
        "(pip install -e '.[cluster]'; set hydra.launcher.partition=... etc.)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="MIN",
        help="refuse a plan estimated above MIN minutes, before any work",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="MIN",
        help="after MIN minutes stop the running jobs (each saves a checkpoint) "
        "and write what finished; the same command resumes",
    )


def check_args(parser: OneLineParser, args: Any) -> None:
    for item in args.overrides:
        if "=" not in item or item.startswith("-"):
            parser.error(f"{item!r} is not an override; write key=value (options start with --)")
    if args.jobs_per_device is not None and args.jobs_per_device < 1:
        parser.error(f"--jobs-per-device {args.jobs_per_device}: must be ≥ 1")
    for name in ("budget", "time_limit"):
        value = getattr(args, name)
        if value is not None and not value > 0:
            parser.error(f"--{name.replace('_', '-')} {value:g}: must be > 0 minutes")
    if args.gpus is not None:
        try:
            gpus = [int(i) for i in args.gpus.split(",")]
        except ValueError:
            parser.error(f"--gpus {args.gpus!r}: write GPU indices, e.g. 0,1")
        if any(i < 0 for i in gpus) or len(set(gpus)) < len(gpus):
            # a GPU named twice would get twice the jobs its memory was planned for
            parser.error(f"--gpus {args.gpus}: name each GPU once, by its index (0, 1, ...)")
        args.gpus = gpus
    if args.launcher != "local" and (args.gpus or args.device != "auto"):
        parser.error(f"--launcher {args.launcher} places jobs itself; drop --device/--gpus")


def resume_line(argv: list[str], out: Path) -> str:
    args = [a for a in argv if a != "--dry-run"]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    script = sys.argv[0] if sys.argv[0].endswith("study.py") else "scripts/study.py"
    return shlex.join(["python", script, *args])


@exit_on_config_error
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    study = load_study(args.recipe)
    if args.only:
        select_jobs(study, args.only)
    out = Path(args.out) if args.out else default_out(study)
    check_writable(out, "--out")
    check_same_study(out, study)
    if args.launcher != "local":
        _check_launcher_installed(args.launcher)
    elif any(o.startswith("hydra.launcher.") for o in args.overrides):
        raise ConfigError(
            "hydra.launcher.* options are the cluster launcher's; add --launcher submitit_slurm"
        )
    compose_jobs(study, args.overrides, None if args.launcher == "local" else args.launcher)
    check_runs_match(out, study)
    from poslab.study.devices import choose_devices, matmul_rate

    if args.launcher == "local":
        devices = choose_devices(args.device, args.gpus)
    else:
        from poslab.study.devices import the_cpu

        devices = [the_cpu()]
    precision = _precision(study, devices[0])
    rate = matmul_rate(devices[0], precision)
    progress = progress_of(out, study)
    plan = make_plan(study, devices, rate, precision, args.jobs_per_device, progress)
    print(plan_text(plan, out, args.launcher), flush=True)
    check_budget(plan, args.budget, args.launcher)
    if args.dry_run:
        return 0
    check_no_job_running(out, study)
    out.mkdir(parents=True, exist_ok=True)
    lock = RunLock(out)
    try:
        lock.acquire()
    except RunBusy:
        holder = (out / ".lock").read_text().strip() or "unknown"
        raise ConfigError(
            f"another study driver (pid {holder}) is running this study in {out}; wait for it "
            f"or stop it (kill {holder})"
        ) from None
    try:
        deadline = time.monotonic() + args.time_limit * 60 if args.time_limit else None
        driver = Driver(plan, out, args.overrides, args.launcher, deadline, resume_line(argv, out))
        return driver.run()
    finally:
        lock.release()


def select_jobs(study: Study, patterns: list[str]) -> None:
    """Keep the jobs whose names match one of the shell patterns (`--only`); none is an error."""
    import fnmatch

    kept = [j for j in study.jobs if any(fnmatch.fnmatchcase(j.name, p) for p in patterns)]
    if not kept:
        example = study.jobs[0].name
        raise ConfigError(
            f"--only {' '.join(patterns)} matches no job of {study.name}; job names look like "
            f"{example} (scripts/study.py {study.name} --dry-run lists them)"
        )
    study.left_out_schemes = {
        override.split("=", 1)[1]
        for job in study.jobs
        if job not in kept
        for override in job.overrides
        if override.startswith("pos=")
    }
    study.jobs = kept


def _precision(study: Study, device: Any) -> str:
    setting = str(study.jobs[0].config["trainer"].get("precision", "auto"))
    if setting != "auto":
        return setting
    if device.kind == "cuda":
        return "bf16-mixed"
    from poslab.model.precision import cpu_auto_precision

    return cpu_auto_precision()[0]


def _check_launcher_installed(launcher: str) -> None:
    import importlib.util

    if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
        raise ConfigError(
            f"--launcher {launcher} needs Hydra's submitit launcher; pip install -e '.[cluster]'"
        )


if __name__ == "__main__":
    sys.exit(main())

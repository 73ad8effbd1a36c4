"""A study recipe (conf/study/NAME.yaml, or any .yaml path) and its jobs, each composed and
checked as `python train.py experiment=<experiment> <user overrides> <job overrides>` would be,
before any work: a typo in one job is one line naming that job."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from poslab.checks import check_schema, number
from poslab.errors import ConfigError

STUDIES = Path(__file__).resolve().parents[1] / "conf" / "study"
TOP_KEYS = {"experiment", "grid", "extra", "jobs", "evals", "baseline", "reference", "plan"}
PLAN_DEFAULTS: dict[str, Any] = {
    "mfu": 0.2,
    "cpu_mfu": 0.5,
    "vocab_size": 32768,
    "eval_tokens": 65536,
    "startup_s": 20.0,
    "corpus_tokens": None,
}
PLAN_SCHEMA = {
    "plan.mfu": number(gt=0, le=1),
    "plan.cpu_mfu": number(gt=0, le=1),
    "plan.vocab_size": number(ge=2),
    "plan.eval_tokens": number(ge=1),
    "plan.startup_s": number(ge=0),
    "plan.corpus_tokens": number(ge=1, null=True),
    "reference.matmul_flops": number(gt=0, null=True),
    "reference.minutes": number(gt=0, null=True),
    "reference.devices": number(ge=1, null=True),
}
REFERENCE_KEYS = {"name", "devices", "matmul_flops", "minutes"}
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


@dataclass
class Job:
    """One training run of a study: its name (its folder under <study>/runs/) and the overrides
    after `experiment=`; `config` is the resolved config once composed."""

    name: str
    overrides: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    # its options as a run folder's .hydra/config.yaml holds them (compare.run_options' form)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Study:
    name: str
    source: Path
    experiment: str
    jobs: list[Job]
    baseline: str | None
    reference: dict[str, Any]
    plan: dict[str, Any]
    # evaluations of every finished job besides its own: name -> eval.py overrides; each lands
    # in <out>/evals/<name>/<job>/ and gets its own merged table, <out>/comparison-<name>/
    evals: dict[str, list[str]] = field(default_factory=dict)
    # the schemes of the jobs `--only` left out: a chunk may hold no baseline job, whose runs
    # come from the study's other chunks
    left_out_schemes: set[str] = field(default_factory=set)


def study_names() -> list[str]:
    return sorted(p.stem for p in STUDIES.glob("*.yaml"))


def load_study(recipe: str) -> Study:
    """The study named `recipe` (conf/study/) or in the .yaml file `recipe`, its jobs listed
    (not yet composed)."""
    path = Path(recipe).expanduser()
    if recipe.endswith((".yaml", ".yml")):
        if not path.is_file():
            raise ConfigError(f"no study file {recipe}; pass a .yaml that exists or a recipe name")
    else:
        path = STUDIES / f"{recipe}.yaml"
        if not path.is_file():
            raise ConfigError(
                f"no study recipe {recipe!r}; choose one of: {', '.join(study_names())} "
                "(or pass a study .yaml file)"
            )
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader) or {}
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text file (not UTF-8); pass a study .yaml") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML ({str(err).splitlines()[0]})") from None
    _only_known(path, "the study", raw, TOP_KEYS)
    experiment = raw.get("experiment")
    if not isinstance(experiment, str) or not experiment:
        raise ConfigError(f"{path}: `experiment:` must name a conf/experiment/ recipe")
    jobs = grid_jobs(raw.get("grid") or {}, path, raw.get("extra") or {})
    jobs += listed_jobs(raw.get("jobs") or {}, path)
    if not jobs:
        raise ConfigError(f"{path} lists no job; give a `grid:` or `jobs:`")
    names = [j.name for j in jobs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{path}: two jobs are named {twice[0]!r}; job names must differ")
    reference = raw.get("reference") or {}
    given_plan = raw.get("plan") or {}
    _only_known(path, "plan", given_plan, set(PLAN_DEFAULTS))
    _only_known(path, "reference", reference, REFERENCE_KEYS)
    baseline = raw.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise ConfigError(f"{path}: `baseline:` must name a scheme (pos=) of the jobs, e.g. rope")
    plan = {**PLAN_DEFAULTS, **given_plan}
    check_schema({"plan": plan, "reference": reference}, PLAN_SCHEMA)
    evals = _evals(raw.get("evals") or {}, path)
    return Study(
        name=path.stem,
        source=path,
        experiment=experiment,
        jobs=jobs,
        baseline=baseline,
        reference=reference,
        plan=plan,
        evals=evals,
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error: PyYAML keeps
    the last, so a second `grid:` or a second job of one name replaced the first silently."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _evals(evals: Any, path: Path) -> dict[str, list[str]]:
    """`evals:` checked: names that make folder names, lists of eval.py overrides."""
    if not isinstance(evals, dict) or not all(
        isinstance(v, list) and v and all(isinstance(o, str) and "=" in o for o in v)
        for v in evals.values()
    ):
        raise ConfigError(
            f"{path}: `evals:` maps names to lists of eval.py overrides, e.g. "
            "test: [eval.split=test]"
        )
    for name, overrides in evals.items():
        _checked_name(str(name), path)
        bad = [
            o for o in overrides if o.split("=", 1)[0].lstrip("+~") in ("run", "out_dir", "ckpt")
        ]
        if bad:
            raise ConfigError(
                f"{path}: evals.{name} sets {bad[0]}; the study sets run= and out_dir="
            )
    return {str(k): list(v) for k, v in evals.items()}


def _only_known(path: Path, where: str, node: Any, known: set[str]) -> None:
    """A mapping with none but the `known` keys: a typo is an error, not a default used."""
    if not isinstance(node, dict):
        raise ConfigError(f"{path}: {where} must be a mapping of {', '.join(sorted(known))}")
    unknown = sorted(set(node) - known)
    if unknown:
        prefix = "" if where == "the study" else f"{where}."
        raise ConfigError(
            f"{path}: {prefix}{unknown[0]} is not a key of {where}; use {', '.join(sorted(known))}"
        )


def _value_text(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "null"
    if isinstance(value, list):
        return "[" + ",".join(_value_text(v) for v in value) + "]"
    return str(value)


def grid_jobs(grid: Any, path: Path, extra: Any = None) -> list[Job]:
    """Every combination of the grid's values, named by its values (`seed` as s<seed>, a dotted
    key by its last part: trainer.max_steps=300 as max_steps300). `extra` maps a grid value
    (`pos=sinusoidal`) to overrides every job with that value also gets."""
    extra = extra or {}
    if not isinstance(extra, dict) or not all(
        isinstance(v, list) and all(isinstance(o, str) and "=" in o for o in v)
        for v in extra.values()
    ):
        raise ConfigError(
            f"{path}: `extra:` maps a grid value to overrides, e.g. "
            "pos=sinusoidal: [model.scale_embeddings=true]"
        )
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"{path}: `grid:` maps options to non-empty lists, e.g. pos: [rope]")
    for key, values in grid.items():
        odd = [v for v in values if v is None or isinstance(v, dict | list)]
        if odd:
            raise ConfigError(
                f"{path}: grid.{key} holds {odd[0]!r}; give plain values (a name or a number)"
            )
    keys = list(grid)
    if not keys:
        return []
    jobs = []
    for values in itertools.product(*(grid[k] for k in keys)):
        parts = [
            f"s{v}"
            if k == "seed"
            else _value_text(v)
            if k == "pos"
            else f"{k.rsplit('.', 1)[-1]}{_value_text(v)}"
            for k, v in zip(keys, values, strict=True)
        ]
        overrides = [f"{k}={_value_text(v)}" for k, v in zip(keys, values, strict=True)]
        overrides += [o for given in overrides for o in extra.get(given, [])]
        jobs.append(Job(_checked_name("-".join(parts), path), overrides))
    unused = sorted(set(extra) - {o for job in jobs for o in job.overrides})
    if unused:
        raise ConfigError(f"{path}: extra.{unused[0]} matches no grid value (write key=value)")
    return jobs


def listed_jobs(jobs: Any, path: Path) -> list[Job]:
    if not isinstance(jobs, dict) or not all(
        isinstance(v, list) and all(isinstance(o, str) for o in v) for v in jobs.values()
    ):
        raise ConfigError(f"{path}: `jobs:` maps job names to lists of overrides (key=value)")
    return [
        Job(_checked_name(str(name), path), list(overrides)) for name, overrides in jobs.items()
    ]


def _checked_name(name: str, path: Path) -> str:
    if not SAFE_NAME.match(name):
        raise ConfigError(
            f"{path}: job name {name!r} must be letters, digits and . _ - = + (a folder name)"
        )
    return name


def compose_jobs(study: Study, overrides: list[str], launcher: str | None = None) -> None:
    """Compose and check every job's config (as train.py would) into `job.config`; the first
    problem is one line naming the job. `launcher` (a hydra/launcher option) is composed too,
    so that its `hydra.launcher.*` overrides are checked."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from poslab.report.compare import settings_of

    extra = [f"hydra/launcher={launcher}"] if launcher else []
    _check_overrides(study, overrides)
    # jobs that differ only in their seed share one composition and one check (Hydra's compose
    # takes ~0.2 s, the check builds the model): the dry run of a study stays within seconds
    composed: dict[tuple[str, ...], Any] = {}
    GlobalHydra.instance().clear()
    with initialize_config_module("poslab.conf", version_base="1.3"):
        for job in study.jobs:
            # the job's own overrides last, as in the job's command: they define it
            given = [f"experiment={study.experiment}", *overrides, *job.overrides, *extra]
            config, as_saved = _composed_job(job, given, composed)
            config.pop("hydra", None)
            as_saved.pop("hydra", None)
            job.config = config
            job.options = settings_of(as_saved)
        _check_evals(study)
    GlobalHydra.instance().clear()
    check_jobs(study)


def _check_evals(study: Study) -> None:
    """Each `evals:` entry composed as eval.py would compose it and its options checked (inside
    an initialized Hydra): a typo failed only once the jobs it evaluates had trained. Two
    entries of the same evaluation would score every job twice."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from poslab.apps.evaluate import ENTRY_KEYS, entry_option_problem
    from poslab.run.cli import hydra_error_line
    from poslab.run.validate import check_eval_config

    seen: dict[str, str] = {}
    for name, overrides in study.evals.items():
        where = f"{study.source.name}: evals.{name}"
        try:
            cfg = compose("eval", overrides=overrides)
            check_eval_config(cfg.eval)
            problem = next(
                filter(None, (entry_option_problem(k, cfg.get(k)) for k in ENTRY_KEYS)), None
            )
            if problem:
                raise ConfigError(problem)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None
        except (HydraException, OmegaConfBaseException, ValueError) as err:
            raise ConfigError(f"{where}: {hydra_error_line(err)}") from None
        same = repr(sorted(overrides))
        if same in seen:
            raise ConfigError(
                f"{where} is evals.{seen[same]} again ({' '.join(overrides)}); keep one"
            )
        seen[same] = name


def _check_overrides(study: Study, overrides: list[str]) -> None:
    """A ConfigError for the user's override of an option the jobs set (theirs would win
    silently), or for any `experiment=` besides the study's own (the study names it)."""
    for given in overrides:
        key = _key(given)
        if key == "resume" or key.startswith(("hydra.run.", "hydra.sweep.")):
            # each job runs with resume=auto in <out>/runs/<job>/: these would be dropped
            raise ConfigError(
                f"{given}: the study places every job in <out>/runs/<job>/ and resumes it "
                "itself (the same command again); drop it, and choose the folder with --out"
            )
    for job in study.jobs:  # (the command line's last value wins, as in train.py: scripts
        # append overrides; a recipe's job is one list, where a key twice is a slip)
        keys = [_key(o) for o in job.overrides]
        twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        if twice is not None:
            both = " and ".join(o for o in job.overrides if _key(o) == twice)
            raise ConfigError(f"job {job.name} set {twice} twice ({both}); give it once")
    set_by_jobs = {_key(o) for job in study.jobs for o in job.overrides}
    clash = [o for o in overrides if _key(o) in set_by_jobs]
    if clash:
        raise ConfigError(
            f"{clash[0]}: the study's jobs set {_key(clash[0])} ({study.source.name}'s grid or "
            "jobs); remove it, or change the recipe"
        )
    for where, given in [("your overrides", overrides)] + [
        (f"job {j.name}", j.overrides) for j in study.jobs
    ]:
        if any(o.lstrip("+~").startswith("experiment=") for o in given):
            raise ConfigError(
                f"{where} set experiment=, which the study sets ({study.experiment}); change "
                f"`experiment:` in {study.source.name} instead"
            )


def _composed_job(
    job: Job, given: list[str], composed: dict[tuple[str, ...], Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`job`'s config composed from the overrides `given` (inside an initialized Hydra) and
    checked, resolved and as .hydra/config.yaml would save it; a problem is a ConfigError naming
    the job. A job that differs from one in `composed` (its overrides but the seed -> its
    config) only in its seed reuses that composition with the seed set and checked."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from poslab.run.cli import hydra_error_line
    from poslab.run.extend import extend_arguments, inherit_parent
    from poslab.run.validate import TRAIN_SCHEMA, check_run_config

    seeds = [o.split("=", 1)[1] for o in job.overrides if o.startswith("seed=")]
    key = tuple(o for o in job.overrides if not o.startswith("seed="))
    try:
        if key in composed and len(seeds) == 1 and re.fullmatch(r"-?\d+", seeds[0]):
            cfg = composed[key].copy()
            cfg.seed = int(seeds[0])
            check_schema(cfg, {"seed": TRAIN_SCHEMA["seed"]})
        else:
            # extend=PARENT: composed as train.py composes it (the parent's pos= and model=
            # first) and given the parent's architecture, so that job.options is what the
            # child's .hydra/config.yaml records (extend.record_effective_config); compared
            # with Hydra's composition instead, a child could never resume (#60)
            given = extend_arguments(["train", *given])[1:]
            cfg = compose("train", overrides=given, return_hydra_config=True)
            with open_dict(cfg):
                cfg.hydra.runtime.output_dir = "."
                cfg.hydra.job.num = 0
            HydraConfig.instance().set_config(cfg)
            inherit_parent(cfg, asked=given)
            check_run_config(cfg)
            composed[key] = cfg
        config = OmegaConf.to_container(cfg, resolve=True)
        as_saved = OmegaConf.to_container(cfg, resolve=False)
    except ConfigError as err:
        raise ConfigError(f"job {job.name}: {err}") from None
    except (HydraException, OmegaConfBaseException, ValueError) as err:
        raise ConfigError(f"job {job.name}: {hydra_error_line(err)}") from None
    return config, as_saved


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def check_jobs(study: Study) -> None:
    """What the study needs of its composed jobs: an evaluation to merge, jobs that differ, and
    a baseline among their schemes."""
    seen: dict[str, str] = {}
    for job in study.jobs:
        if not job.config["eval"].get("after_train", True):
            raise ConfigError(
                f"job {job.name}: eval.after_train=false leaves no evaluation for the study to "
                "merge; remove it"
            )
        settings = json.dumps(
            {k: v for k, v in job.config.items() if k != "run_name"}, sort_keys=True, default=str
        )
        if settings in seen:
            raise ConfigError(
                f"jobs {seen[settings]} and {job.name} have the same settings; give them "
                "different seeds or options"
            )
        seen[settings] = job.name
    schemes = sorted({job.config["pos_name"] for job in study.jobs})
    known = {*schemes, *study.left_out_schemes}
    if study.baseline is not None and study.baseline not in known:
        raise ConfigError(
            f"{study.source.name}: baseline {study.baseline!r} is no scheme of its jobs; "
            f"choose one of: {', '.join(schemes)}"
        )

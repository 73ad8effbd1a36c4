"""LongRoPE's search of per-pair rescale factors for a finished rotary run:
`python scripts/longrope_search.py RUN --target T` (`poslab-longrope-search`).

The method (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens",
arXiv 2402.13753, §3.2 and its Algorithm 1; the released search, microsoft/LongRoPE
evolution/search.py and evolution/algorithms/): pair i at position n turns by n·θ_i/λ_i, one
rescale factor λ_i per rotary pair, found by an evolutionary search that minimises perplexity at
the target length T (s = T/L) on a few long samples. What poslab follows:

* the search space: each λ_i on a grid of step 0.01 from 1 to a maximum (the reference code's
  `dim_mono` mutation grid, evolution/algorithms/dim_mono.py: 1 + s, the default here; the
  paper's own bound was not checked against its text), and non-decreasing over the pairs,
  λ_i ≤ λ_(i+1) (a slower pair is never interpolated less than a faster one; the code's
  `dim_mono` algorithm);
* the initial population: the PI, NTK-aware and YaRN factors (the paper; the code seeds with
  YaRN's alone), and mutations of them up to the population size;
* a generation: the k best so far are the parents and stay (elitism: the best never gets
  worse); N1 mutations of random parents (each λ_i, with probability p, redrawn from the grid
  between its neighbours' values) and N2 crossovers of two parents (each λ_i, with probability
  p, taken from the second; retried while the child breaks the order or was seen, then a
  mutation instead); a candidate is scored once (the code's history);
* the attention factor sqrt(1 + ln s/ln L) on cos/sin (the code's default `su` policy): the
  candidates are scored by `eval.rope_scaling.kind=longrope` itself, at factor auto.

Where poslab differs:

* the sizes, for a CPU: a population of 16, 8 parents, 4 mutations and 4 crossovers a
  generation, 3 generations, 4 windows of T (the code's defaults, dim_mono.json: 64, 32, 16, 16,
  40 iterations; its examples score 5 PG19 validation documents truncated to T); each an option;
* the objective's text: the last samples·T + 1 tokens of the run's own train split, scored as
  non-overlapping windows of T, so the validation and test splits the evaluation reports stay
  unseen by the search. The run may have trained on those tokens, in windows of L: the search
  fits positions past L, not the text;
* n̂ (the paper's first positions kept un-interpolated) is not searched (n̂ = 0): Phi-3 and
  HF's `longrope`, which the eval-time kind implements, have none;
* one search at one target: no progressive extension (search, fine-tune, search again) and no
  re-search of the short factors: short_factor is all ones (the trained frequencies up to L).

It writes longrope_factors.json (long_factor, short_factor, the target, the objective's best
perplexity by generation, the seeds' perplexities, the settings, the command), which
`eval.rope_scaling.factors_file=PATH` and `extend=RUN +pos.scaling.kind=longrope
+pos.scaling.factors_file=PATH` read.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from poslab.arguments import OneLineParser, at_least, check_writable
from poslab.checks import integer, number, require
from poslab.data.tokens import TokenizedSplit
from poslab.errors import ConfigError, exit_on_config_error
from poslab.evaluation.perplexity import score
from poslab.evaluation.plan import EvalPlan, load_models, plan_lengths, resolved
from poslab.evaluation.run import checked_cache, checkpoint_of_run
from poslab.model.build import model_from_checkpoint, read_checkpoint
from poslab.model.precision import AUTOCAST_DTYPE
from poslab.positions.rope_scaling import RopeScaling, scaling_options
from poslab.run.validate import PRECISION_CHOICES, check_eval_config

CONF = Path(__file__).resolve().parents[1] / "conf"
FILE = "longrope_factors.json"
SEEDS = ("pi", "ntk", "yarn")


@dataclass
class SearchSettings:
    """The search's options (scripts/longrope_search.py --help), checked on construction."""

    target: int
    population: int = 16  # P: the initial population (the code: 64)
    parents: int = 8  # k: the best kept each generation (the code: 32)
    mutations: int = 4  # N1 a generation (the code: 16)
    crossovers: int = 4  # N2 a generation (the code: 16)
    generations: int = 3  # (the code: 40)
    mutation_prob: float = 0.3  # p: each factor's chance to change (the code: 0.3)
    crossover_tries: int = 20  # (the code: 20)
    step: float = 0.01  # the factors' grid (the code: 0.01)
    max_factor: float | None = None  # None: 1 + s (the reference code's grid)
    samples: int = 4  # windows of T scored per candidate
    seed: int = 0
    batch_size: int | None = None  # windows per forward pass; None: eval's default
    device: str = "auto"
    precision: str = "auto"  # as eval.precision

    def __post_init__(self) -> None:
        require("--target", self.target, integer(2))
        for name in ("population", "parents", "crossover_tries", "samples"):
            require(f"--{name.replace('_', '-')}", getattr(self, name), integer(1))
        for name in ("mutations", "crossovers", "generations", "seed"):
            require(f"--{name}", getattr(self, name), integer(0))
        require("--mutation-prob", self.mutation_prob, number(gt=0, le=1))
        require("--step", self.step, number(gt=0))
        require("--max-factor", self.max_factor, number(gt=1, null=True))
        require("--batch-size", self.batch_size, integer(1, null=True))
        if self.population < len(SEEDS):
            raise ConfigError(
                f"--population {self.population}: the initial population holds the "
                f"{len(SEEDS)} seeds ({', '.join(SEEDS)}); pass at least {len(SEEDS)}"
            )
        if not 2 <= self.parents <= self.population:
            raise ConfigError(
                f"--parents {self.parents}: a crossover needs 2 parents, chosen among the "
                f"population ({self.population}); pass 2 to {self.population}"
            )
        if self.generations and self.mutations + self.crossovers == 0:
            raise ConfigError(
                "--mutations 0 --crossovers 0: a generation would add no candidate; "
                "pass at least one of them, or --generations 0"
            )

    def upper(self, scale: float) -> float:
        """The largest factor: --max-factor, else 1 + s; at least s (PI's factors)."""
        upper = self.max_factor if self.max_factor is not None else 1.0 + scale
        if upper < scale:
            raise ConfigError(
                f"--max-factor {upper:g} is below s = T/L = {scale:g}, PI's factor (a seed); "
                f"pass at least {scale:g}"
            )
        return upper


# ---- the search over factor vectors, given an objective ------------------------------------


class Evolution:
    """LongRoPE's evolution search (module doc) over non-decreasing factor vectors on a grid in
    [1, upper], minimising `objective` (a candidate is scored once: `scored`)."""

    def __init__(
        self,
        objective: Callable[[np.ndarray], float],
        settings: SearchSettings,
        upper: float,
        progress: bool = True,
    ) -> None:
        self.objective, self.settings, self.progress = objective, settings, progress
        self.lower, self.upper, self.step = 1.0, upper, settings.step
        self.rng = np.random.default_rng(settings.seed)
        self.scored: dict[tuple[float, ...], float] = {}

    def snap(self, factors: np.ndarray) -> np.ndarray:
        """On the grid and within [1, upper] (both keep the order: monotone maps)."""
        grid = np.round((np.asarray(factors, dtype=np.float64) - 1.0) / self.step)
        top = math.floor((self.upper - 1.0) / self.step + 1e-9)
        return np.round(1.0 + np.clip(grid, 0, top) * self.step, 10)

    def valid(self, factors: np.ndarray) -> bool:
        return bool(np.all(np.diff(factors) >= 0)) and tuple(factors) not in self.scored

    def score(self, factors: np.ndarray) -> float:
        key = tuple(float(f) for f in factors)
        if key not in self.scored:
            value = float(self.objective(np.asarray(key)))
            self.scored[key] = value if math.isfinite(value) else math.inf
        return self.scored[key]

    def mutate(self, factors: np.ndarray) -> np.ndarray | None:
        """Each factor, with probability p, redrawn on the grid between its neighbours (the
        first from 1, the last up to the maximum): the order holds by construction; retried
        until the child is new (None after 100 tries: the neighbourhood is exhausted)."""
        top = self.snap(np.array([self.upper]))[0]
        for _ in range(100):
            child = factors.copy()
            for i in np.flatnonzero(self.rng.random(len(child)) < self.settings.mutation_prob):
                low = child[i - 1] if i > 0 else self.lower
                high = child[i + 1] if i + 1 < len(child) else top
                choices = np.round(np.arange(low, high + self.step / 2, self.step), 10)
                child[i] = choices[self.rng.integers(len(choices))]
            if self.valid(child):
                return child
        return None

    def crossover(self, first: np.ndarray, second: np.ndarray) -> np.ndarray | None:
        """The first parent with each factor, with probability p, taken from the second;
        retried while the child breaks the order or was seen (None: no such child)."""
        if np.array_equal(first, second):
            return None
        for _ in range(self.settings.crossover_tries):
            take = self.rng.random(len(first)) < self.settings.mutation_prob
            child = np.where(take, second, first)
            if self.valid(child):
                return child
        return None

    def initial(self, seeds: list[np.ndarray]) -> list[np.ndarray]:
        """The seeds (snapped, each once), then mutations of them up to the population."""
        population: list[np.ndarray] = []
        for seed in seeds:
            snapped = self.snap(seed)
            if not any(np.array_equal(snapped, p) for p in population):
                population.append(snapped)
        bar = tqdm(total=self.settings.population, desc="initial population", **self.bar())
        for factors in population:
            self.score(factors)
            bar.update()
        misses = 0
        while len(population) < self.settings.population and misses < 100:
            child = self.mutate(population[self.rng.integers(min(len(seeds), len(population)))])
            if child is None:
                misses += 1
                continue
            self.score(child)
            population.append(child)
            bar.update()
            bar.set_postfix(best=f"{min(self.scored.values()):.4g}")
        bar.close()
        return population

    def generation(self, parents: list[np.ndarray], index: int) -> list[np.ndarray]:
        """The parents and this generation's children, each scored."""
        settings = self.settings
        children: list[np.ndarray] = []
        total = settings.mutations + settings.crossovers
        bar = tqdm(total=total, desc=f"generation {index}", **self.bar())
        for j in range(total):
            if j < settings.mutations:
                child = self.mutate(parents[self.rng.integers(len(parents))])
            else:
                a, b = sorted(self.rng.choice(len(parents), 2, replace=False))
                child = self.crossover(parents[a], parents[b])
                child = child if child is not None else self.mutate(parents[a])
            if child is not None:
                self.score(child)
                children.append(child)
            bar.update()
            bar.set_postfix(best=f"{min(self.scored.values()):.4g}")
        bar.close()
        return [*parents, *children]

    def run(self, seeds: list[np.ndarray]) -> tuple[np.ndarray, list[float]]:
        """(the best factors found, the best perplexity after the initial population and after
        each generation: non-increasing, as the parents stay)."""
        population = self.initial(seeds)
        best_by_generation = [min(self.scored[tuple(p)] for p in population)]
        for index in range(1, self.settings.generations + 1):
            ranked = sorted(population, key=lambda p: self.scored[tuple(p)])
            population = self.generation(ranked[: self.settings.parents], index)
            best_by_generation.append(min(self.scored[tuple(p)] for p in population))
        best = min(population, key=lambda p: self.scored[tuple(p)])
        return best, best_by_generation

    def bar(self) -> dict[str, Any]:
        return {"disable": not self.progress, "leave": False, "dynamic_ncols": True}


# ---- the run: its model, its text, the seeds ------------------------------------------------


@dataclass
class Problem:
    """What the search scores a candidate on: the run's model at T, the objective's tokens."""

    ckpt: Path
    plan: EvalPlan
    tokens: TokenizedSplit
    first_token: int  # where the tokens start in the train split
    rotary_dims: int

    @property
    def target(self) -> int:
        return self.plan.lengths[0]

    @property
    def scale(self) -> float:
        return self.target / self.plan.train_length

    def scaling(self, long_factor: np.ndarray | list[float]) -> dict[str, Any]:
        """The scheme's `scaling` option for these long factors (short: ones), as
        eval.rope_scaling.kind=longrope builds it at T."""
        options = {
            "kind": "longrope",
            "factor": "auto",
            "long_factor": [float(f) for f in long_factor],
            "short_factor": [1.0] * (self.rotary_dims // 2),
        }
        config = self.plan.config
        return scaling_options(options, config["pos"], self.target, self.plan.train_length)

    def perplexity(self, long_factor: np.ndarray) -> float:
        """The objective: perplexity of the model with these factors over the tokens."""
        model = self.plan.models[self.target].to(self.plan.device)
        model.pos.scaling = RopeScaling.from_options(self.scaling(long_factor))
        model.pos.scaling.check_dims(self.rotary_dims)
        result = score(
            model,
            self.tokens,
            self.target,
            "nonoverlapping",
            batch_size=self.plan.eval_cfg.batch_size,
            autocast_dtype=AUTOCAST_DTYPE[self.plan.precision],
            progress=False,
        )
        return result.ppl

    def seeds(self) -> dict[str, np.ndarray]:
        """λ_i = θ_i/θ'_i of PI, NTK-aware and YaRN at s = T/L (poslab's own kinds; PI's
        position scale 1/s as λ = s); a kind this model cannot take is left out. A pair that
        never turns (θ_i = 0: p_rope, hope) takes the factor before it (it changes nothing
        there), so the seeds stay non-decreasing."""
        model = self.plan.models[self.target]
        theta = model.pos.frequencies().detach().cpu()
        seeds = {}
        for kind in SEEDS:
            try:
                kind_scaling = RopeScaling(
                    kind=kind, factor=self.scale, train_length=self.plan.train_length
                )
                changed = kind_scaling.theta(theta, self.rotary_dims, self.target, model.pos.base)
            except ConfigError:  # ntk with R = 2
                continue
            ratio = (theta / (changed * kind_scaling.method.position_scale)).double().numpy()
            ratio = np.where(theta.numpy() > 0, ratio, 1.0)
            seeds[kind] = np.maximum.accumulate(ratio)
        return seeds


def longrope_eval_cfg(settings: SearchSettings, pairs: int) -> Any:
    """conf/eval/default.yaml at the single length T with longrope (placeholder factors), the
    search's batch size, device and precision."""
    cfg = OmegaConf.load(CONF / "eval" / "default.yaml")
    cfg.lengths, cfg.log_wandb, cfg.batch_size = [settings.target], False, settings.batch_size
    cfg.device, cfg.precision = settings.device, settings.precision
    cfg.rope_scaling.kind = "longrope"
    cfg.rope_scaling.long_factor = cfg.rope_scaling.short_factor = [1.0] * pairs
    return cfg


def prepare(run: str | Path, settings: SearchSettings, data_path: str | None) -> Problem:
    """The run's checkpoint, checked to be a text run of a rotary scheme trained at L < T, its
    model at T with eval.rope_scaling.kind=longrope, and the objective's tokens."""
    run = Path(run)
    ckpt = run if run.is_file() else checkpoint_of_run(run)
    checkpoint = read_checkpoint(ckpt)
    config = checkpoint["hyper_parameters"]["config"]
    if "task" in config["data"]:
        raise ConfigError(f"{run} was trained on a generated task; the search needs a text run")
    length = int(config["data"]["seq_len"])
    if settings.target <= length:
        raise ConfigError(
            f"--target {settings.target} is not past the run's training length L = {length}: "
            "long_factor acts beyond L; pass a longer target"
        )
    trained, _ = model_from_checkpoint(checkpoint, ckpt)
    dims = getattr(trained.pos, "rotary_dims", None)
    if dims is None or not getattr(trained.pos, "eval_scaling", False):
        raise ConfigError(
            f"{run} uses {type(trained.pos).__name__}, not a rotary scheme with one position "
            "per pair (rope, xpos, ...): it has no rescale factors to search"
        )
    eval_cfg = resolved(longrope_eval_cfg(settings, dims // 2))
    check_eval_config(eval_cfg)
    plan = plan_lengths(eval_cfg, config, ckpt=ckpt)
    load_models(plan, checkpoint)
    tokens, first = objective_tokens(plan, settings, data_path)
    return Problem(ckpt, plan, tokens, first, dims)


def objective_tokens(
    plan: EvalPlan, settings: SearchSettings, data_path: str | None = None
) -> tuple[TokenizedSplit, int]:
    """The last samples·T + 1 tokens of the run's train split (its own tokenizer), and the
    index of the first: `samples` non-overlapping windows of T."""
    train = checked_cache(plan, None, data_path).split("train")
    need = settings.samples * settings.target + 1
    if len(train) < need:
        raise ConfigError(
            f"the train split holds {len(train):,} tokens, fewer than --samples "
            f"{settings.samples} windows of --target {settings.target} need ({need:,}); "
            "pass fewer samples or a shorter target"
        )
    first = len(train) - need
    ids, words, nbytes = (np.asarray(a[first:]) for a in (train.ids, train.words, train.bytes))
    return TokenizedSplit(ids, words, nbytes), first


# ---- the command ------------------------------------------------------------------------------


def search(
    run: str | Path,
    settings: SearchSettings,
    data_path: str | None = None,
    progress: bool = True,
    command: str = "",
) -> dict[str, Any]:
    """The search on `run` (module doc): the record longrope_factors.json holds (`command`:
    the command line that asked for it)."""
    started = time.time()
    problem = prepare(run, settings, data_path)
    torch.manual_seed(settings.seed)
    scale = problem.scale
    evolution = Evolution(problem.perplexity, settings, settings.upper(scale), progress)
    seeds = problem.seeds()
    best, by_generation = evolution.run(list(seeds.values()))
    seed_ppl = {kind: evolution.scored[tuple(evolution.snap(f))] for kind, f in seeds.items()}
    pairs = problem.rotary_dims // 2
    return {
        "long_factor": [float(f) for f in best],
        "short_factor": [1.0] * pairs,
        "target": problem.target,
        "train_length": problem.plan.train_length,
        "scale": scale,
        "perplexity": evolution.scored[tuple(best)],
        "best_by_generation": by_generation,
        "seeds": seed_ppl,
        "candidates_scored": len(evolution.scored),
        "objective": {
            "split": "train",
            "first_token": problem.first_token,
            "tokens": len(problem.tokens),
            "windows": settings.samples,
            "mode": "nonoverlapping",
            "device": str(problem.plan.device),
            "precision": problem.plan.precision,
        },
        "settings": {**asdict(settings), "max_factor": evolution.upper},
        "checkpoint": str(problem.ckpt.resolve()),
        "command": command,
        "seconds": round(time.time() - started, 1),
    }


USAGE = """Search LongRoPE's per-pair rescale factors (long_factor) for a finished rotary run, at
a target length T past its training length L, by LongRoPE's evolution search (minimising the
perplexity at T on the last windows of the run's train split); writes OUT/longrope_factors.json.

python scripts/longrope_search.py outputs/runs/DATE/TIME_NAME --target 512
python eval.py run=RUN eval.rope_scaling.kind=longrope \\
    eval.rope_scaling.factors_file=OUT/longrope_factors.json

The defaults are sized for a CPU (LongRoPE's own: --population 64 --parents 32 --mutations 16
--crossovers 16 --generations 40). A run that is not rotary, T <= L, bad sizes, an OUT that holds
the file: one `error: ...` line with exit code 2, nothing written. See
poslab/evaluation/longrope_search.py for where this follows the paper and where it differs.
"""


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="scripts/longrope_search.py", description=USAGE)
    parser.add_argument("run", type=Path, help="a training run folder (or a .ckpt file)")
    parser.add_argument("--target", type=at_least(2), required=True, help="T, past the run's L")
    parser.add_argument("--out", type=Path, default=None, help="default: outputs/longrope/RUN_T")
    defaults = SearchSettings(target=2)
    for name in ("population", "parents", "mutations", "crossovers", "generations", "samples"):
        parser.add_argument(f"--{name}", type=int, default=getattr(defaults, name))
    parser.add_argument("--crossover-tries", type=int, default=defaults.crossover_tries)
    parser.add_argument("--mutation-prob", type=float, default=defaults.mutation_prob)
    parser.add_argument("--step", type=float, default=defaults.step, help="the factors' grid")
    parser.add_argument("--max-factor", type=float, default=None, help="default: 1 + T/L")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=None, help="windows per forward")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--precision", choices=PRECISION_CHOICES, default="auto", help="as eval.precision"
    )
    parser.add_argument("--data-path", default=None, help="the corpus, if it moved")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    fields = set(SearchSettings.__dataclass_fields__)
    settings = SearchSettings(**{k: v for k, v in vars(args).items() if k in fields})
    run = args.run.resolve()
    name = (run if not run.is_file() else run.parent.parent).name  # RUN/checkpoints/x.ckpt
    out = args.out or Path("outputs") / "longrope" / f"{name}_T{args.target}"
    if (out / FILE).exists():
        raise ConfigError(f"--out {out} already holds {FILE}; pass another --out")
    check_writable(out, "--out")
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "scripts/longrope_search.py", *given])
    record = search(args.run, settings, args.data_path, not args.quiet, command)
    out.mkdir(parents=True, exist_ok=True)
    (out / FILE).write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"wrote {out / FILE}: perplexity {record['perplexity']:.4g} at T = {record['target']} "
        f"(seeds: {', '.join(f'{k} {v:.4g}' for k, v in record['seeds'].items())}); "
        f"score it with eval.rope_scaling.kind=longrope "
        f"eval.rope_scaling.factors_file={out / FILE}",
        flush=True,
    )

"""Result rows as files: JSON (everything), CSV, a Markdown table and PNG plots, written all or
none (`write_all_or_none`): a full disk or a kill leaves the previous set complete, never a
truncated JSON beside an older table."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from poslab.errors import NO_SPACE_ERRNOS, ConfigError
from poslab.report.differences import difference_set
from poslab.report.figures import (
    accuracy_figure,
    context_figure,
    difference_figure,
    heatmap_figure,
    position_figure,
    ppl_figure,
    report_styles,
)
from poslab.report.multiples import (
    family_accuracy_figure,
    family_position_figure,
    family_ppl_figure,
)
from poslab.report.tables import is_finite, is_nonfinite, is_task, markdown, metric_name
from poslab.run.tracking import log_results

CSV_FIELDS = [
    "scheme",
    "train_length",
    "mode",
    "split",
    "length",
    "factor",
    "status",
    "tokens",
    "windows",  # the forward windows scored at this length
    "documents",  # eval.documents: the documents scored at this length (documents.py)
    "document_ppl_mean",
    "loss",
    "ppl",
    "word_ppl",
    "bits_per_byte",
    "tokens_per_s",
    "seconds",
    # eval.short_context (context_use.py): the long–short difference
    "short_context",
    "context_gain",
    "key_token_share",
    "key_token_ppl",
    "vocab_size",
    # rows merged over seeds (poslab.report.seeds): the spread and the seeds
    "loss_sd",
    "ppl_sd",
    "word_ppl_sd",
    "bits_per_byte_sd",
    "ratio",
    "ratio_sd",
    "n_seeds",
    "seeds",
    # generated tasks (poslab.evaluation.tasks): answer accuracy, and a uniform guess's
    "task",
    "accuracy",
    "accuracy_sd",
    "token_accuracy",
    "token_accuracy_sd",
    "chance",
    "token_chance",
    "shortcut",
    "shortcut_token",
    "shortcut_name",
    "examples",
    # learned at L, effective length (RULER), steps to learn (poslab.evaluation.tasks)
    "learned_at",
    "learned",
    "learned_seeds",
    "effective_length",
    "effective_length_sd",
    "steps_to_learn",
    "steps_to_learn_sd",
    "trained_steps",
    # a task rendered for a pretrained model (pretrained_tasks.py): its model tokens per example
    "example_tokens_min",
    "example_tokens_mean",
    "example_tokens_max",
    "task_words_mean",
]


def make_folder(out: Path) -> bool:
    """`out` made if missing (True: this call made it); no room for it: one line."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        if err.errno in NO_SPACE_ERRNOS:
            raise no_room_error(out, err) from None
        raise
    return created


def csv_text(rows: list[dict]) -> str:
    """The rows as CSV, in the columns of CSV_FIELDS."""
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return table.getvalue()


def write_reports(
    rows: list[dict],
    out: Path,
    title: str,
    series_key: str = "mode",
    stem: str = "extrapolation",
    text: str | None = None,
    position_rows: list[dict] | None = None,
    baseline: str | None = None,
    below: str = "",
) -> dict[str, Path]:
    """Write {stem}.json/.csv/.md, {stem}_ppl.png (ppl vs length, one line per `series_key`)
    and {stem}_loss_by_position.png to `out` (with a `baseline` row, {stem}_differences.png
    too: see report_figures); returns the paths. All or none: every file is
    rendered and written to a temporary first, and the set replaces the old one only once all
    are on disk (see write_all_or_none); a folder this call created is removed on failure.
    `below`: a caption under every figure (what the numbers rest on: report/provenance.py)."""
    created = make_folder(out)
    paths = {
        "json": out / f"{stem}.json",
        "csv": out / f"{stem}.csv",
        "md": out / f"{stem}.md",
        "ppl_plot": out / f"{stem}_ppl.png",
        "position_plot": out / f"{stem}_loss_by_position.png",
    }
    files: dict[Path, FileWriter] = {
        paths["json"]: text_file(json.dumps(rows, indent=1)),
        paths["csv"]: text_file(csv_text(rows)),
        paths["md"]: text_file((text or markdown(rows, title, series_key)) + "\n"),
    }
    figures: list[Figure] = []  # closed at the end, whatever happens

    def plot(path: Path, fig: Figure) -> None:
        figures.append(fig)
        if below:
            fig.text(0.01, -0.01, below, ha="left", va="top", fontsize=6.5, color="0.35")
        files[path] = png_file(fig, tight=bool(below))

    try:
        del paths["position_plot"]  # back below if the report has one
        figures_made = report_figures(rows, title, series_key, stem, position_rows, baseline)
        for key, name, fig in figures_made:
            paths[key] = out / name
            plot(paths[key], fig)
        write_all_or_none(files)
    except BaseException:
        if created:  # nothing of this call left behind (an empty folder included)
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    finally:
        for fig in figures:
            plt.close(fig)
    return paths


def report_figures(
    rows: list[dict],
    title: str,
    series_key: str = "mode",
    stem: str = "extrapolation",
    position_rows: list[dict] | None = None,
    baseline: str | None = None,
) -> Iterator[tuple[str, str, Figure]]:
    """The figures of a report, as (path key, file name, figure), one at a time (the caller
    closes each). Every series keeps one style in all of them (report_styles). A task's
    report: accuracy, the condition heatmap (when its rows have conditions) and the answer
    tokens' perplexity; a corpus': perplexity and loss by position (`position_rows`, by default
    the rows of the first mode). With a `baseline` (a row's scheme), also every other row's
    difference to it with its 95% interval, in the first mode (`difference_figure`)."""
    if not is_task(rows) and position_rows is None:
        position_rows = [r for r in rows if r["mode"] == rows[0]["mode"]]
    styles = report_styles([*rows, *(position_rows or [])], series_key)
    if is_task(rows):  # accuracy, the condition heatmap, and the answer tokens' perplexity
        accuracy = family_accuracy_figure(rows, series_key, title, styles, baseline)
        yield (
            "accuracy_plot",
            f"{stem}_accuracy.png",
            accuracy or accuracy_figure(rows, series_key, title, styles),
        )
        heatmap = heatmap_figure(rows, series_key, title)
        if heatmap is not None:
            yield "heatmap", f"{stem}_heatmap.png", heatmap
        tasks = ", ".join(dict.fromkeys(r["task"] for r in rows if r.get("task")))
        answer_title = f"{tasks}: answer perplexity" if tasks else "answer perplexity"
        yield "ppl_plot", f"{stem}_ppl.png", perplexity(rows, series_key, answer_title, styles)
    else:
        yield "ppl_plot", f"{stem}_ppl.png", perplexity(rows, series_key, title, styles, baseline)
        position_rows = position_rows or []
        positions = family_position_figure(position_rows, title, styles, series_key, baseline)
        yield (
            "position_plot",
            f"{stem}_loss_by_position.png",
            positions or position_figure(position_rows, title, styles, series_key),
        )
        context = context_figure(rows, series_key, styles)
        if context is not None:  # rows that measured context use (eval.short_context)
            yield "context_plot", f"{stem}_context.png", context
    if baseline is not None and series_key == "scheme":
        # the first mode in which some row has a difference (the baseline may lack a mode)
        modes = dict.fromkeys(r["mode"] for r in rows)
        found = next(
            (f for f in (difference_set(rows, baseline, m) for m in modes) if f.by_scheme),
            difference_set(rows, baseline, rows[0]["mode"]),
        )
        fig = difference_figure(found, title, styles)  # titled by what it draws
        if fig is not None:
            yield "difference_plot", f"{stem}_differences.png", fig


def perplexity(
    rows: list[dict],
    series_key: str,
    title: str,
    styles: dict | None = None,
    baseline: str | None = None,
) -> Figure:
    """Perplexity against evaluation length: by family for more than MOST_ROWS series
    (multiples.py), else on one panel with its shape beside it (figures.ppl_figure)."""
    by_family = family_ppl_figure(rows, series_key, title, styles, baseline)
    return by_family or ppl_figure(rows, series_key, title, styles)


def longest_rows(rows: list[dict]) -> list[dict]:
    """The rows of a comparison's loss-by-position figure: each series of the first mode at its
    longest evaluated length with a finite loss (what compare.py passes as position_rows)."""
    if not rows:
        return []
    mode0 = rows[0]["mode"]
    longest: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["length"]):
        if r["mode"] == mode0 and r["status"] == "ok" and not is_nonfinite(r, "loss"):
            longest[r["scheme"]] = r
    return list(longest.values())


def write_figures(
    rows: list[dict],
    out: Path,
    title: str,
    series_key: str = "mode",
    stem: str = "extrapolation",
    position_rows: list[dict] | None = None,
    baseline: str | None = None,
) -> dict[str, Path]:
    """Only the PNGs of write_reports (all or none), e.g. to re-draw a committed report from its
    JSON with the current figure code (scripts/replot.py); the tables are left as they are."""
    files: dict[Path, FileWriter] = {}
    paths: dict[str, Path] = {}
    figures: list[Figure] = []
    try:
        made = report_figures(rows, title, series_key, stem, position_rows, baseline)
        for key, name, fig in made:
            figures.append(fig)
            paths[key] = out / name
            files[paths[key]] = png_file(fig)
        write_all_or_none(files)
    finally:
        for fig in figures:
            plt.close(fig)
    return paths


def report_title(md: Path) -> str | None:
    """The title a report was written with: the first line of its Markdown ("## title")."""
    try:
        first = md.read_text().split("\n", 1)[0]
    except OSError:
        return None
    return first[3:].strip() if first.startswith("## ") else None


def report_baseline(md: Path) -> str | None:
    """The baseline a report's differences were taken to (its "### difference to NAME (mode)"
    heading), else None."""
    try:
        text = md.read_text()
    except OSError:
        return None
    found = re.search(r"^### difference to (.+) \([\w-]+\): ", text, flags=re.MULTILINE)
    return found.group(1) if found else None


# beside a task's report: scripts/baselines.py's tables of every shortcut, one "## seed N" each
SHORTCUTS = "shortcuts.md"
SHORTCUT_ROW = re.compile(r"^\| (\d+) \| ([^|]+?) \| ([-\d.]+) \| ([-\d.]+) \|$", re.MULTILINE)


def committed_shortcuts(path: Path) -> dict[int, dict]:
    """The best shortcut at each length from the tables of `path` (scripts/baselines.py's
    "| length | predictor | accuracy | token accuracy |", one "## ..." section per seed): in
    each seed the best exact-match and the best token accuracy of the predictors other than
    chance, then their means over the seeds, as the rows' `shortcut`, `shortcut_token`; {}
    without the file (what docs/results.md states as the _best shortcut_ row)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    by_length: dict[int, list[tuple[float, float]]] = {}
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        best: dict[int, tuple[float, float]] = {}
        for length, name, exact, token in SHORTCUT_ROW.findall(section):
            if name.strip() != "chance":
                a, t = best.get(int(length), (0.0, 0.0))
                best[int(length)] = (max(a, float(exact)), max(t, float(token)))
        for length, values in best.items():
            by_length.setdefault(length, []).append(values)
    return {
        n: {
            "shortcut": sum(a for a, _ in seeds) / len(seeds),
            "shortcut_token": sum(t for _, t in seeds) / len(seeds),
            "shortcut_name": f"the best of {path.name}, mean over {len(seeds)} seed(s)",
        }
        for n, seeds in by_length.items()
    }


def with_committed_shortcuts(rows: list[dict], path: Path) -> list[dict]:
    """`rows` with the best shortcut of `path` (committed_shortcuts) at their length where they
    state none (rows written before the evaluation stored it, e.g. grid2d's), for the figures;
    the report's files are not written."""
    found = committed_shortcuts(path)
    return [
        {**r, **found[r["length"]]}
        if r.get("length") in found and not is_finite(r.get("shortcut"))
        else r
        for r in rows
    ]


def replot_report(folder: Path, out: Path | None = None, stem: str = "comparison") -> dict:
    """Draw a written report's PNGs again from its {stem}.json with the current figure code, as
    write_reports draws them (compare.py's series key "scheme", the title of its {stem}.md, the
    loss by position of `longest_rows`, the differences to the baseline its {stem}.md names),
    into `out` (default: `folder`). The JSON, CSV and
    Markdown are read, never written. A folder without {stem}.json is a ConfigError."""
    source = folder / f"{stem}.json"
    try:
        rows = json.loads(source.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"cannot read {source} ({err}); pass a report folder (compare.py --out)"
        ) from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "scheme" in r for r in rows):
        raise ConfigError(f"{source} is not a report's rows (a list of rows with a scheme)")
    title = report_title(folder / f"{stem}.md")
    if title is None:
        raise ConfigError(f"{folder / stem}.md has no '## title' first line to title the figures")
    out = out or folder
    make_folder(out)
    rows = with_committed_shortcuts(rows, folder / SHORTCUTS)
    baseline = report_baseline(folder / f"{stem}.md")
    if baseline is not None and baseline not in {r["scheme"] for r in rows}:
        baseline = None  # a heading of another table: no difference figure
    return write_figures(rows, out, title, "scheme", stem, longest_rows(rows), baseline)


def plot_ppl_vs_length(rows: list[dict], path: Path, series_key: str, title: str) -> None:
    """Perplexity vs eval length (log-x), one line per scheme (or mode); see ppl_yaxis."""
    save(perplexity(rows, series_key, title), path)


def plot_loss_vs_position(rows: list[dict], path: Path, title: str) -> None:
    """Mean loss by position in the window, one line per (scheme, length), log-x positions."""
    save(family_position_figure(rows, title) or position_figure(rows, title), path)


def save(fig: Figure, path: Path) -> None:
    """One PNG, written atomically (see write_all_or_none); closes the figure."""
    try:
        write_all_or_none({path: png_file(fig)})
    finally:
        plt.close(fig)


# writing a set of files all or none
FileWriter = Callable[[IO[bytes]], None]  # writes one file's bytes to an open binary file


def text_file(text: str) -> FileWriter:
    data = text.encode()

    def write(f: IO[bytes]) -> None:
        f.write(data)

    return write


def png_file(fig: Figure, tight: bool = False) -> FileWriter:
    # format= because a file object has no suffix to tell matplotlib; `tight` takes in a
    # caption drawn below the figure
    box = {"bbox_inches": "tight"} if tight else {}
    return lambda f: fig.savefig(f, dpi=120, format="png", **box)


def temporary_path(path: Path) -> Path:
    """Where `path` is written before it replaces the old file: `.<name>.<pid>.tmp` in the same
    folder, so the rename stays on one file system (and compare.py never reads it)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def no_room_error(path: Path, err: OSError) -> ConfigError:
    return ConfigError(
        f"cannot write {path}: the disk is full ({err.strerror or os.strerror(err.errno or 0)}); "
        "the previous results are intact (nothing was replaced); free some space and run again"
    )


def write_all_or_none(files: dict[Path, FileWriter]) -> None:
    """Write a set of files (the results of one evaluation) so that readers see the whole old
    set or the whole new one: each file goes to `temporary_path`, flushed and fsync'd, and only
    once every one of them is on disk are they renamed over the old files (os.replace, atomic
    per file). A failure while writing (a full disk, a permission, a kill by an exception)
    removes the temporaries and leaves the previous files untouched; no room to write is a
    ConfigError naming the path. (The renames themselves only fail if the folder is removed
    under us; then the temporaries are removed too.)"""
    temporaries: list[tuple[Path, Path]] = []
    path: Path | None = None
    try:
        for path, write in files.items():
            tmp = temporary_path(path)
            temporaries.append((tmp, path))
            with open(tmp, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())  # on disk before the rename: a crash never shows an empty file
        for tmp, path in temporaries:
            os.replace(tmp, path)
    except BaseException as err:
        for tmp, _ in temporaries:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and err.errno in NO_SPACE_ERRNOS and path is not None:
            raise no_room_error(path, err) from None
        raise
    for folder in {p.parent for p in files}:
        sync_folder(folder)


def sync_folder(folder: Path) -> None:
    """fsync a folder, so the renames in it survive a crash (best effort: not every file
    system lets a folder be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_rows(paths: Iterable[Path]) -> list[dict]:
    rows = []
    for p in paths:
        rows += json.loads(Path(p).read_text())
    return rows


# where an evaluation's files go, and their W&B copy


def report_rows(
    rows: list[dict],
    title: str,
    ckpt: str | Path,
    out_dir: str | Path | None,
    eval_cfg: Any,
    wandb_run: Any,
    run_folder: Path | None = None,
) -> list[dict]:
    """Write an evaluation's rows to <out_dir>/extrapolation/ (after training: the run folder),
    print its table, log it to W&B when asked; returns the rows. Without out_dir (eval.py) the
    files go to a folder of the checkpoint's run (or of `run_folder`: a pretrained model's) that
    holds no results yet (results_folder)."""
    if out_dir:
        out, claimed = Path(out_dir) / "extrapolation", False
    else:
        out, claimed = results_folder(run_folder or default_out_dir(ckpt), rows)
    try:
        paths = write_reports(rows, out, title, series_key="mode")
        if out_dir:
            record_evaluated_run(Path(out_dir), ckpt)
    except BaseException:
        if claimed:  # the new folder stays only with a complete set of results in it
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    print(markdown(rows, title, "mode", brief=True), flush=True)
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}", flush=True)
    if wandb_run is not None and eval_cfg.log_wandb:
        log_to_wandb(wandb_run, rows, paths)
    return rows


EVALUATED_RUN = "evaluated_run.json"


def record_evaluated_run(out_dir: Path, ckpt: str | Path) -> None:
    """Beside an out_dir's results, the training run they evaluated (when the checkpoint is in
    a run's checkpoints/): compare.py reads that run's options, so evaluations of the seeds of
    one configuration merge into one row over seeds, paired by seed like runs."""
    checkpoint = Path(ckpt).resolve()
    if checkpoint.parent.name == "checkpoints":
        record = {"run": str(checkpoint.parent.parent), "checkpoint": str(checkpoint)}
        (out_dir / EVALUATED_RUN).write_text(json.dumps(record, indent=1) + "\n")


def evaluated_run(out_dir: Path) -> Path | None:
    """The training run an eval.py out_dir evaluated (record_evaluated_run), or None."""
    try:
        return Path(json.loads((out_dir / EVALUATED_RUN).read_text())["run"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def default_out_dir(ckpt: str | Path) -> Path:
    """The run folder of a checkpoint in <run>/checkpoints/, else the checkpoint's own folder."""
    parent = Path(ckpt).resolve().parent
    return parent.parent if parent.name == "checkpoints" else parent


def folder_slug(text: str, limit: int = 48) -> str:
    """`text` as part of a folder name: `yarn s=auto` -> `yarn-s-auto`."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-._")[:limit].rstrip("-._")


def claim_folder(folder: Path) -> bool:
    """Create `folder`; False if it exists. No room or no permission: one line (ConfigError)."""
    try:
        folder.mkdir(parents=True)
    except FileExistsError:
        return False
    except OSError as err:
        if err.errno in NO_SPACE_ERRNOS:
            raise no_room_error(folder, err) from None
        if isinstance(err, PermissionError):
            raise ConfigError(
                f"cannot create {folder}: permission denied; pass out_dir=FOLDER (a folder you "
                "can write to)"
            ) from None
        raise
    return True


def results_folder(run: Path, rows: list[dict]) -> tuple[Path, bool]:
    """Where eval.py without out_dir writes, and whether this call created (claimed) it.

    The run's `extrapolation/` while it holds nothing (a run evaluated for the first time, e.g.
    one trained with eval.after_train=false or stopped before its evaluation), so compare.py
    finds it as the run's result. Otherwise a new `extrapolation-<time>[-<variant>]/` beside
    it: a re-evaluation (another eval.rope_scaling.kind, another split, ...) never replaces the
    after-training table. compare.py's find_results finds only `extrapolation/extrapolation.json`
    (a folder named exactly `extrapolation`) in a run or sweep, so the new folder adds no row to
    a comparison of the run or its sweep and never poses as another seed of it (passed itself,
    it is a row named by its folder). Says where the files go."""
    first = run / "extrapolation"
    if claim_folder(first):
        return first, True
    if first.is_dir() and not any(first.iterdir()):
        return first, False
    variant = folder_slug(str(rows[0].get("variant") or "")) if rows else ""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    base = f"extrapolation-{stamp}-{variant}" if variant else f"extrapolation-{stamp}"
    for n in range(1, 1000):
        folder = run / (base if n == 1 else f"{base}-{n}")
        if not claim_folder(folder):  # a second eval.py in the same second takes the next name
            continue
        print(
            f"{first} already holds results (kept as they are); this evaluation goes to {folder} "
            "(out_dir=FOLDER writes to FOLDER/extrapolation/ instead)",
            flush=True,
        )
        return folder, True
    raise ConfigError(f"{run} has no free name for a new results folder ({base}-N); pass out_dir=")


def log_to_wandb(run: Any, rows: list[dict], paths: dict[str, Path]) -> None:
    """A table, a line plot per mode (perplexity, or accuracy for a task), and the PNGs, in the
    given W&B run."""
    ok = [r for r in rows if r["status"] == "ok"]
    value = "accuracy" if any("accuracy" in r for r in ok) else "ppl"
    extra = ["token_accuracy", "ppl", "loss"] if value == "accuracy" else ["loss", metric_name(ok)]
    log_results(run, ok, value, extra, paths)

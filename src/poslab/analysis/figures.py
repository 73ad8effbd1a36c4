"""What every analysis writes: NAME.png and NAME.csv in the output folder; and NAME.png drawn
again from NAME.csv (`read_csv`, `save_png`) with the current plotting code."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402

DPI = 120


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def save(fig: Any, rows: list[dict], out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)  # only now: a failed analysis leaves no empty folder
    if rows:
        write_csv(out / f"{name}.csv", rows)
    fig.savefig(out / f"{name}.png", dpi=DPI)
    plt.close(fig)
    print(f"wrote {out / name}.png and {name}.csv", flush=True)


def save_png(fig: Any, out: Path, name: str) -> Path:
    """Only the figure (a re-plot from the CSV leaves the CSV as it is); closes it."""
    path = out / f"{name}.png"
    try:
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    print(f"wrote {path}", flush=True)
    return path


def read_csv(path: Path) -> list[dict]:
    """The rows of NAME.csv with their numbers as numbers (int, float, bool; "" as None), as the
    analysis made them."""
    with path.open(newline="") as f:
        return [{k: parse_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]


def parse_cell(text: str) -> Any:
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text

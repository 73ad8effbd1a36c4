"""What every analysis writes: NAME.png and NAME.csv in the output folder."""

from __future__ import annotations

import csv
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

"""What positions computed in bf16 (pos.position_dtype=bf16) become: exact positions, distinct
rotary angles, wrong ALiBi distances (cli.py's doc)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.ticker
import torch
from matplotlib.figure import Figure

from poslab.analysis.figures import save
from poslab.plotting import (
    COLOURS,
    coincide_label,
    coinciding,
    finish_figure,
    hidden_style,
    new_figure,
    plain_number,
)

# the measured fractions, and the line style each is drawn in
CURVES = {"exact_positions": "-o", "distinct_angle_vectors": "--s", "wrong_alibi_distances": ":^"}


def position_collisions(length: int, dtype: str, d_model: int = 512, n_head: int = 8) -> dict:
    """What the positions 0..length−1 become with pos.position_dtype=`dtype` (cli.py's doc)."""
    from poslab.positions import build_scheme

    positions = torch.arange(length)
    rope = build_scheme("rope", d_model, n_head, position_dtype=dtype)
    values = rope.prepare(positions).fp32
    angles = rope.angles(values)
    alibi = build_scheme("alibi", d_model, n_head, position_dtype=dtype)
    exact = build_scheme("alibi", d_model, n_head)
    last, keys = positions[-1:], positions
    wrong = alibi.attention_bias(last, keys) != exact.attention_bias(last, keys)  # (H, 1, T)
    return {
        "length": length,
        "position_dtype": dtype,
        "exact_positions": float((values == positions.float()).float().mean()),
        "distinct_angle_vectors": angles.unique(dim=0).shape[0] / length,
        "wrong_alibi_distances": float(wrong[0, 0].float().mean()),
    }


def run_collisions(out: Path, max_length: int) -> list[dict]:
    lengths = [n for n in (2**k for k in range(8, 20)) if n <= max_length] or [max_length]
    rows = [position_collisions(n, dtype) for dtype in ("fp32", "bf16") for n in lengths]
    for r in rows:
        if r["position_dtype"] == "bf16":
            print(
                f"collisions bf16 N={r['length']}: exact {r['exact_positions']:.3f}, distinct "
                f"angles {r['distinct_angle_vectors']:.3f}, wrong alibi distances "
                f"{r['wrong_alibi_distances']:.3f}"
            )
    save(collisions_figure(rows), rows, out, "collisions")
    return rows


def collisions_figure(rows: list[dict]) -> Figure:
    """Each measured fraction against N, for bf16 and (fainter, its colour's other dash) fp32;
    from the rows (collisions.csv). Curves equal at every N (fp32's are 1, 1, 0 throughout)
    are named in the legend."""
    fig = new_figure(7.0, 4.2)
    ax = fig.subplots()
    curves: dict[str, list[tuple[float, float]]] = {}
    looks: dict[str, dict] = {}
    for k, key in enumerate(CURVES):
        for j, dtype in enumerate(("bf16", "fp32")):
            mine = [r for r in rows if r["position_dtype"] == dtype]
            label = f"{key} ({dtype})"
            curves[label] = [(float(r["length"]), float(r[key])) for r in mine]
            marker, ls = CURVES[key][-1], ("-", "--")[j]
            looks[label] = {
                "color": COLOURS[k],
                "marker": marker,
                "ls": ls,
                "alpha": 0.9 if dtype == "bf16" else 0.5,
            }
    hidden = coinciding(curves, near=0.004)  # 0.4% of the [0, 1] axis
    handles = []
    for label, pts in curves.items():
        style = hidden_style(looks[label]) if label in hidden else looks[label]
        (line,) = ax.plot(*zip(*pts, strict=True), label=coincide_label(label, hidden), **style)
        handles.append(line)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: plain_number(v)))
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("positions 0..N−1")
    ax.set_ylabel("fraction")
    ax.set_title("Positions computed in bf16 (pos.position_dtype=bf16) vs fp32")
    ax.grid(True, alpha=0.3)
    return finish_figure(fig, handles, [h.get_label() for h in handles])

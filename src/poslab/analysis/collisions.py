"""What positions computed in bf16 (pos.position_dtype=bf16) become: exact positions, distinct
rotary angles, wrong ALiBi distances (cli.py's doc)."""

from __future__ import annotations

from pathlib import Path

import torch

from poslab.analysis.figures import plt, save

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
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for key, style in CURVES.items():
        for dtype in ("fp32", "bf16"):
            mine = [r for r in rows if r["position_dtype"] == dtype]
            ax.plot(
                [r["length"] for r in mine],
                [r[key] for r in mine],
                style,
                label=f"{key} ({dtype})",
                alpha=0.8 if dtype == "bf16" else 0.4,
            )
    for r in rows:
        if r["position_dtype"] == "bf16":
            print(
                f"collisions bf16 N={r['length']}: exact {r['exact_positions']:.3f}, distinct "
                f"angles {r['distinct_angle_vectors']:.3f}, wrong alibi distances "
                f"{r['wrong_alibi_distances']:.3f}"
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("positions 0..N−1")
    ax.set_ylabel("fraction")
    ax.set_title("Positions computed in bf16 (pos.position_dtype=bf16) vs fp32")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save(fig, rows, out, "collisions")
    return rows

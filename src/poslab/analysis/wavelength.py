"""The wavelength λ_i = 2π/θ_i of every rotary frequency against a training length L, and YaRN's
ramp over r_i = L/λ_i (cli.py's doc)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from poslab.analysis.decay import rope_thetas
from poslab.analysis.figures import save
from poslab.plotting import finish_figure, new_figure, styles_for

YARN_ALPHA, YARN_BETA = 1.0, 32.0  # YaRN's ramp boundaries (Peng et al. 2023)


def wavelengths(head_dim: int, base: float) -> np.ndarray:
    """λ_i = 2π/θ_i = 2π·base^(2i/d), i = 0..d/2−1: the tokens one turn of pair i takes.

    A check against the seed FAQ, which quotes for d = 512 "i = 0 → 6.28, i = 128 → 316,
    i = 256 → 15811". No natural convention with base 10000 gives all three: i = 0 → 2π holds in
    every one, but this convention (poslab's, RoFormer's) gives 2π·100 ≈ 628 at i = 128 and has no
    i = 256 (i stops at d/2 − 1 = 255); 2π·10000^(i/d) gives 62.8 and 628; π·10000^(2i/d) gives
    314 at i = 128 but π at i = 0. The three numbers are one geometric sequence (each ×≈50 per
    128 indices, as every convention's is), and match this formula with base ≈ 2500
    (2π·2500^(2i/512): 6.28, 314, 15708, within 0.7%): the FAQ's base, not its shape, is off.
    tests/test_analysis.py checks what holds."""
    return 2 * math.pi / rope_thetas(head_dim, base)


def yarn_ramp(ratio: np.ndarray, alpha: float = YARN_ALPHA, beta: float = YARN_BETA) -> np.ndarray:
    """YaRN's γ_i = clamp((r_i − α)/(β − α), 0, 1) for r_i = L/λ_i: 0 interpolates the frequency
    fully (fewer than α turns within L), 1 keeps it (more than β turns)."""
    return np.clip((np.asarray(ratio) - alpha) / (beta - alpha), 0.0, 1.0)


def wavelength_rows(head_dim: int, base: float, train_length: int) -> list[dict]:
    """One row per rotary frequency: θ_i, λ_i, r_i = L/λ_i, whether it turns within L, and
    YaRN's γ_i."""
    lam = wavelengths(head_dim, base)
    ratio = train_length / lam
    gamma = yarn_ramp(ratio)
    return [
        {
            "base": base,
            "head_dim": head_dim,
            "i": i,
            "theta": 2 * math.pi / lam[i],
            "wavelength": float(lam[i]),
            "train_length": train_length,
            "ratio": float(ratio[i]),
            "full_period": bool(lam[i] <= train_length),
            "yarn_gamma": float(gamma[i]),
        }
        for i in range(len(lam))
    ]


def run_wavelength(
    out: Path, bases: list[float], head_dims: list[int], train_length: int
) -> list[dict]:
    rows: list[dict] = []
    for d in head_dims:
        for base in bases:
            rows += wavelength_rows(d, base, train_length)
            print(
                f"wavelength d={d} base={base:g} L={train_length}: "
                + _summary(d, base, train_length)
            )
    save(wavelength_figure(rows), rows, out, "wavelength")
    return rows


def wavelength_figure(rows: list[dict]) -> Figure:
    """One panel per head dim: λ_i against i per base (a dot per pair, filled where λ_i ≤ L),
    and YaRN's boundaries λ = L/α, L/β; from the rows (wavelength.csv)."""
    head_dims = list(dict.fromkeys(int(r["head_dim"]) for r in rows))
    bases = list(dict.fromkeys(float(r["base"]) for r in rows))
    train_length = int(rows[0]["train_length"])
    styles = styles_for(f"base {b:g}" for b in bases)
    fig = new_figure(5.5 * len(head_dims), 4.2)
    axes = fig.subplots(1, len(head_dims), squeeze=False)
    handles: list[Any] = []
    bounds: list[Any] = []
    for ax, d in zip(axes[0], head_dims, strict=True):
        for base in bases:
            mine = sorted(
                (r for r in rows if int(r["head_dim"]) == d and float(r["base"]) == base),
                key=lambda r: int(r["i"]),
            )
            lam = np.array([float(r["wavelength"]) for r in mine])
            line = _draw_wavelengths(ax, lam, base, train_length, styles[f"base {base:g}"])
            handles.append(line)
        for r, style in ((YARN_ALPHA, "--"), (YARN_BETA, ":")):
            line = ax.axhline(
                train_length / r, color="k", ls=style, lw=0.8, label=_bound_label(r, train_length)
            )
            if ax is axes[0][0]:
                bounds.append(line)
        ax.set_yscale("log")
        ax.set_xlabel("frequency index i (θ_i = base^(−2i/d))")
        ax.set_ylabel("wavelength λ_i = 2π/θ_i (tokens)")
        ax.set_title(f"head dim d = {d}; filled: λ_i ≤ L = {train_length}")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("RoPE wavelengths against the training length (YaRN's r_i = L/λ_i)")
    handles += bounds
    return finish_figure(fig, handles, [h.get_label() for h in handles])


def _draw_wavelengths(
    ax: Any, lam: np.ndarray, base: float, train_length: int, style: dict[str, Any]
) -> Any:
    """λ_i against i: a line, and a dot per pair (the style's marker), filled where it turns
    within L; returns the line."""
    index = np.arange(len(lam))
    full = lam <= train_length
    head_dim = 2 * len(lam)
    label = f"d = {head_dim}, base {base:g}: {full.sum()} of {len(lam)} pairs turn within L"
    colour, marker = style["color"], style["marker"]
    (line,) = ax.plot(index, lam, lw=1, color=colour, ls=style["ls"], label=label)
    ax.scatter(index[full], lam[full], s=12, color=colour, marker=marker)
    ax.scatter(index[~full], lam[~full], s=12, facecolors="none", edgecolors=colour, marker=marker)
    return line


def _summary(head_dim: int, base: float, train_length: int) -> str:
    lam = wavelengths(head_dim, base)
    ratio = train_length / lam
    return (
        f"{(lam <= train_length).sum()}/{len(lam)} pairs with λ ≤ L; "
        f"{(ratio > YARN_BETA).sum()} with r > β={YARN_BETA:g} (kept by YaRN), "
        f"{(ratio < YARN_ALPHA).sum()} with r < α={YARN_ALPHA:g} (interpolated); "
        f"λ_max = {lam[-1]:.0f}"
    )


def _bound_label(r: float, train_length: int) -> str:
    """The legend of the line λ = L/r for YaRN's boundaries r = α and r = β."""
    if r == YARN_ALPHA:
        return f"λ = L/α = {train_length} (r = α = 1)"
    return f"λ = L/β = {train_length / YARN_BETA:g} (r = β = 32)"

"""Every figure kind, drawn from awkward made-up rows, checked on the drawn figure: 16 series with
long labels, two pairs of coinciding rows, perplexities 125-165 (and one row to 2,000, which
forces a log axis), accuracies near 0 and 1 whose ± sd would spill past [0, 1], perplexity sds
larger than the mean, rows merged over seeds. From fig.canvas.draw() and the artists' window
extents: every text on the canvas, two labelled ticks inside the data on each value axis, no two
series alike, bands inside [0, 1] (accuracy) or above 0 (perplexity), coincidences named, legends
in natural order, one style per scheme across a report's figures. More than 8 rows (the 29 of
extrapolation_cpu_all): small multiples by family on shared axes with the baseline in each panel
and a panel of each family's best; titles that name their quantity; zero-width intervals drawn
as intervals; the loss by position smoothed with its band over seeds; grid2d's committed best
shortcut as its accuracy baseline."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.text import Text

from poslab.analysis.attention import attention_figure
from poslab.analysis.collisions import collisions_figure
from poslab.analysis.decay import decay_figure, decay_rows
from poslab.analysis.sinusoidal import sinusoidal_figure
from poslab.analysis.t5_buckets import t5_buckets_figure
from poslab.analysis.wavelength import wavelength_figure, wavelength_rows
from poslab.positions.rope_theta import theta_figure
from poslab.report.families import BEST_TITLE
from poslab.report.figures import (
    accuracy_figure,
    heatmap_figure,
    natural_sorted,
    position_figure,
    ppl_figure,
    report_styles,
    style_for_index,
)
from poslab.report.files import longest_rows, report_figures

LENGTHS = (64, 128, 256, 512, 1024)
TRAIN = 64
# 16 schemes: long labels, numbers to sort naturally, and two pairs that coincide (mrope = rope,
# dynamic_ntk = ntk: the first of each pair is drawn first, beneath)
SCHEMES = [
    "rope",
    "mrope",
    "ntk",
    "dynamic_ntk",
    *(f"rope [pos.base={b}, optim.pos_lr_scale=10]" for b in ("100", "1000", "10000.0", "100000")),
    "alibi",
    "t5 [pos.max_distance=128, pos.num_buckets=32]",
    "kerple",
    "fire",
    "sandwich",
    "cope",
    "xpos",
    "alibi randomized N=2048 [pos.randomized_positions=true, seed=1]",
]
COINCIDE = {"mrope": "rope", "dynamic_ntk": "ntk"}


def ppl_of(scheme: str, i: int) -> float:
    """125-165 at the i-th length: every scheme a slightly different level and slope (a
    coinciding scheme its twin's)."""
    k = SCHEMES.index(COINCIDE.get(scheme, scheme))
    return 125.0 + 2.2 * k + 1.3 * i * (k % 4) / 3


def corpus_rows(outlier: bool = False) -> list[dict]:
    rows = []
    for scheme in SCHEMES:
        for i, n in enumerate(LENGTHS):
            ppl = ppl_of(scheme, i)
            if outlier and scheme == "alibi":
                ppl = 140.0 * (2000.0 / 140.0) ** (i / (len(LENGTHS) - 1))  # to 2,000
            loss = math.log(ppl)
            buckets = [
                [p, loss + 0.3 * math.sin(p / 7) - 0.1 * math.log1p(p), 32] for p in range(n)
            ]
            if scheme in COINCIDE:  # its buckets equal its twin's too
                twin = next(r for r in rows if r["scheme"] == COINCIDE[scheme] and r["length"] == n)
                buckets = twin["loss_by_position"]
            sd = ppl * 1.4 if scheme == "cope" else 0.8  # a spread larger than the mean
            rows.append(
                {
                    "scheme": scheme,
                    "mode": "nonoverlapping",
                    "split": "validation",
                    "length": n,
                    "train_length": TRAIN,
                    "factor": n / TRAIN,
                    "status": "ok",
                    "loss": loss,
                    "ppl": ppl,
                    "n_seeds": 3,
                    "seeds": "1 2 3",
                    "ppl_sd": sd,
                    "loss_sd": 0.01,
                    "ratio": ppl / ppl_of(scheme, 0),
                    "ratio_sd": 1.2 if scheme == "cope" else 0.004,
                    "loss_by_position": buckets,
                    "vocab_size": 8191,
                }
            )
    return rows


def task_rows() -> list[dict]:
    """A passkey-like task: accuracy near 0 and 1 with sds that would spill (0.59 ± 0.34, 0.98 ±
    0.1, 0.02 ± 0.2), conditions by depth, merged over 3 seeds."""
    rows = []
    depths = (0.0, 0.25, 0.5, 0.75, 1.0)
    for scheme in SCHEMES:
        twin = COINCIDE.get(scheme, scheme)
        level = [0.98, 0.59, 0.02, 0.995, 0.005][SCHEMES.index(twin) % 5]
        for i, n in enumerate(LENGTHS):
            acc = min(1.0, max(0.0, level - 0.01 * i * (SCHEMES.index(twin) % 3)))
            ppl = 1.05 + 40.0 * (1 - acc) * (i + 1)
            rows.append(
                {
                    "scheme": scheme,
                    "mode": "passkey",
                    "task": "passkey",
                    "split": "generated",
                    "length": n,
                    "train_length": TRAIN,
                    "factor": n / TRAIN,
                    "status": "ok",
                    "accuracy": acc,
                    "accuracy_sd": 0.34 if level == 0.59 else 0.2,
                    "token_accuracy": min(1.0, acc + 0.01),
                    "token_accuracy_sd": 0.3,
                    "token_chance": 0.1,
                    "chance": 1e-5,
                    "shortcut": 0.05,
                    "shortcut_token": 0.2,
                    "loss": math.log(ppl),
                    "ppl": ppl,
                    "ppl_sd": ppl * 1.75,  # answer perplexity: sd well above the mean
                    "ratio": ppl / (1.05 + 40.0 * (1 - level)),
                    "ratio_sd": 3.0,
                    "n_seeds": 3,
                    "seeds": "1 2 3",
                    "learned": scheme != "sandwich",
                    "by_condition": [
                        {"condition": {"depth": d}, "accuracy": min(1.0, acc + 0.01 * j)}
                        for j, d in enumerate(depths)
                    ],
                }
            )
    return rows


# ---------------------------------------------------------------- what is checked


def texts_drawn(fig) -> list:
    """Every text the figure shows (titles, axis and tick labels in view, notes, legends)."""
    found = [*fig.texts, *fig.legends]
    for ax in fig.axes:
        found += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        if ax.get_legend():
            found.append(ax.get_legend())
        if not ax.axison:
            continue
        found += [ax.xaxis.label, ax.yaxis.label]
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if lo - 1e-9 * abs(hi) <= tick.get_loc() <= hi + 1e-9 * abs(hi):
                    found += [tick.label1, tick.label2]
    return [t for t in found if t.get_visible() and (not isinstance(t, Text) or t.get_text())]


def check_on_canvas(fig) -> None:
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    for artist in texts_drawn(fig):
        box = artist.get_window_extent(renderer)
        what = artist.get_text() if isinstance(artist, Text) else type(artist).__name__
        assert box.x0 >= -1 and box.y0 >= -1, (what[:60], box)
        assert box.x1 <= width + 1 and box.y1 <= height + 1, (what[:60], box, width, height)


def series_of(ax) -> list:
    """The data series of an axes: labelled lines with markers (not reference lines)."""
    return [
        line
        for line in ax.get_lines()
        if not line.get_label().startswith("_") and line.get_marker() not in (None, "None", "")
    ]


def check_unique_styles(ax) -> None:
    looks = [
        (
            tuple(np.round(plt.matplotlib.colors.to_rgba(ln.get_color()), 4)),
            ln.get_linestyle(),
            ln.get_marker(),
        )
        for ln in series_of(ax)
    ]
    assert len(looks) == len(set(looks)), "two series drawn alike"


def labelled_ticks_in_data(ax) -> list[float]:
    """The labelled y ticks that fall inside [min, max] of the plotted series."""
    ys = [y for ln in series_of(ax) for y in ln.get_ydata() if np.isfinite(y)]
    lo, hi = min(ys), max(ys)
    inside = []
    for tick in ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks():
        if tick.label1.get_text().strip() and lo * (1 - 1e-9) <= tick.get_loc() <= hi * (1 + 1e-9):
            inside.append(tick.get_loc())
    view = sorted(ax.get_ylim())
    return [t for t in inside if view[0] <= t <= view[1]]


def band_ys(ax) -> list[float]:
    return [
        y
        for c in ax.collections
        if isinstance(c, PolyCollection)
        for path in c.get_paths()
        for y in path.vertices[:, 1]
    ]


def legend_labels(fig) -> list[str]:
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for leg in legends for t in leg.get_texts()]


def style_of(fig, prefix: str) -> tuple:
    for ax in fig.axes:
        for ln in series_of(ax):
            if ln.get_label() == prefix or ln.get_label().startswith(prefix + " "):
                return (ln.get_color(), ln.get_linestyle(), ln.get_marker())
    raise AssertionError(f"no line {prefix!r}")


@pytest.fixture
def drawn():
    figures = []

    def draw(fig):
        figures.append(fig)
        fig.canvas.draw()
        return fig

    yield draw
    for fig in figures:
        plt.close(fig)


# ---------------------------------------------------------------- the report figures


@pytest.mark.parametrize("outlier", [False, True], ids=["125-165", "one row to 2,000 (log axis)"])
def test_ppl_figure_with_its_shape_panel_is_readable(outlier, drawn):
    rows = corpus_rows(outlier)
    title = "perplexity vs evaluation length: " + ", ".join(SCHEMES[:6])  # a long title
    fig = drawn(ppl_figure(rows, "scheme", title))
    check_on_canvas(fig)
    ppl_ax, shape_ax = fig.axes[:2]
    assert (ppl_ax.get_yscale() == "log") == outlier
    for ax in (ppl_ax, shape_ax):
        check_unique_styles(ax)
        assert len(series_of(ax)) == len(SCHEMES)
        assert len(labelled_ticks_in_data(ax)) >= 2, ax.get_ylabel()
        assert min(band_ys(ax)) > 0  # cope's sd is 1.4 × its mean: never down to 0 or below
    labels = legend_labels(fig)
    assert "mrope (= rope, coincide)" in labels
    assert "dynamic_ntk (= ntk, coincide)" in labels
    based = [label for label in labels if "pos.base=" in label]
    assert [b.split("=")[1].split(",")[0] for b in based] == ["100", "1000", "10000.0", "100000"]


def test_position_figure_is_readable_and_keeps_the_reports_styles(drawn):
    rows = corpus_rows()
    styles = report_styles(rows, "scheme")
    title = "learnable θ: fixed vs learned as is (raw) vs as log θ, 3 seeds: loss by position"
    fig = drawn(position_figure(longest_rows(rows), title, styles, "scheme"))
    check_on_canvas(fig)
    (ax,) = fig.axes
    check_unique_styles(ax)
    assert len(series_of(ax)) == len(SCHEMES)
    assert len(labelled_ticks_in_data(ax)) >= 2
    assert any(
        label.startswith("mrope L=1024 (= rope L=1024, coincide)") for label in legend_labels(fig)
    )
    ppl = drawn(ppl_figure(rows, "scheme", "t", styles))
    for scheme in ("alibi", "rope [pos.base=10000.0, optim.pos_lr_scale=10]", "xpos"):
        assert style_of(fig, f"{scheme} L=1024") == style_of(ppl, scheme)


def test_accuracy_figure_is_readable_with_bands_inside_0_and_1(drawn):
    rows = task_rows()
    fig = drawn(accuracy_figure(rows, "scheme", "passkey: accuracy vs evaluation length"))
    check_on_canvas(fig)
    for ax in fig.axes[:2]:
        check_unique_styles(ax)
        assert len(labelled_ticks_in_data(ax)) >= 2
        ys = band_ys(ax)
        assert ys and min(ys) >= 0.0 and max(ys) <= 1.0
    labels = legend_labels(fig)
    assert "mrope (= rope, coincide)" in labels
    assert "sandwich (did not learn at L)" in labels


def test_answer_perplexity_bands_stay_above_0_on_a_log_axis(drawn):
    fig = drawn(ppl_figure(task_rows(), "scheme", "passkey: answer perplexity"))
    check_on_canvas(fig)
    for ax in fig.axes[:2]:
        assert ax.get_yscale() == "log"
        assert min(band_ys(ax)) > 0
        assert len(labelled_ticks_in_data(ax)) >= 2


def test_heatmap_is_titled_for_what_it_shows(drawn):
    fig = drawn(heatmap_figure(task_rows(), "scheme", "passkey: accuracy vs evaluation length"))
    check_on_canvas(fig)
    title = fig._suptitle.get_text().replace("\n", " ")
    assert "passkey: accuracy" in title and "by depth and evaluation length" in title
    assert "mean over 3 seeds" in title
    colourbar = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert colourbar and "mean over 3 seeds" in colourbar[0].get_ylabel()


def test_one_report_gives_a_scheme_one_style_in_every_figure(drawn):
    rows = [r for r in task_rows() if r["scheme"] in ("alibi", "cope", "xpos", "rope", "mrope")]
    figures = {key: drawn(fig) for key, _, fig in report_figures(rows, "t", "scheme", "c")}
    assert set(figures) == {"accuracy_plot", "heatmap", "ppl_plot"}
    for scheme in ("alibi", "cope", "xpos"):
        assert style_of(figures["accuracy_plot"], scheme) == style_of(figures["ppl_plot"], scheme)


def test_styles_are_unique_for_any_number_of_series():
    looks = [tuple(str(v) for v in style_for_index(i).values()) for i in range(1000)]
    assert len(set(looks)) == len(looks)
    assert natural_sorted(["b=10000.0", "b=100000", "b=100", "b=1000"]) == [
        "b=100",
        "b=1000",
        "b=10000.0",
        "b=100000",
    ]


# ---------------------------------------------------------------- the analysis figures


def test_analysis_figures_are_readable(drawn):
    schemes = SCHEMES[:14]
    attention = [
        {
            "scheme": s,
            "train_length": 128,
            "eval_length": 512,
            "windows": 4,
            "split": "validation",
            "layer": layer,
            "head": head,
            "mean_distance": 10.0 + 8 * k + layer + head,
            "mass_beyond_L": min(1.0, 0.05 * k + 0.01 * head),
        }
        for k, s in enumerate(schemes)
        for layer in range(4)
        for head in range(4)
    ]
    collisions = [
        {
            "length": n,
            "position_dtype": dtype,
            "exact_positions": 1.0 if dtype == "fp32" else min(1.0, 256 / n),
            "distinct_angle_vectors": 1.0 if dtype == "fp32" else min(1.0, 256 / n) + 0.001,
            "wrong_alibi_distances": 0.0 if dtype == "fp32" else 1 - min(1.0, 256 / n),
        }
        for dtype in ("fp32", "bf16")
        for n in (256, 512, 1024, 2048)
    ]
    sinusoidal = [
        {"distance": r, "d_model": d, "base": 10000.0, "similarity": math.cos(r / 40) / (1 + r / d)}
        for d in (64, 256)
        for r in range(300)
    ]
    wavelength = [
        row for d in (16, 32) for b in (100.0, 10000.0) for row in wavelength_rows(d, b, 64)
    ]
    t5 = [
        {
            "run": f"{k}_t5-small-L128",
            "max_distance": md,
            "seed": k,
            "train_length": 128,
            "bucket": b,
            "first_distance": None if b == 31 and md == 32 else round(md * 2 ** (b / 8 - 3)),
            "last_distance": None if b == 31 and md == 32 else round(md * 2 ** ((b + 1) / 8 - 3)),
            "bias_mean": -0.1 * b + 0.01 * k,
            "share_at_L": 0.5**b,
            "share_at_16L": 0.7**b,
            "bias_head0": -0.1 * b,
            "bias_head1": -0.12 * b + 0.01 * k,
        }
        for k, md in enumerate([32, 64, 128, 256] * 3)
        for b in range(32)
    ]
    collisions_fig = collisions_figure(collisions)
    for fig in (
        attention_figure(attention),
        collisions_fig,
        decay_figure(decay_rows([100.0, 10000.0, 500000.0], [16, 32], 512)),
        sinusoidal_figure(sinusoidal),
        wavelength_figure(wavelength),
        t5_buckets_figure(t5),
    ):
        drawn(fig)
        check_on_canvas(fig)
        for ax in fig.axes:
            check_unique_styles(ax)
    # fp32's exact positions and distinct angles are 1 at every N
    assert any("coincide" in label for label in legend_labels(collisions_fig))


def test_theta_figure_holds_every_line(drawn):
    """A raw θ that grew 1,353× and one that turned negative: the y-range holds both."""
    rows = []
    for run, (variant, seed) in enumerate(
        [("rope θ raw", s) for s in (1, 2, 3, 4, 5)] + [("rope θ log", s) for s in (1, 2, 3)]
    ):
        for i in range(32):
            ratio = 1.0 + 0.01 * i
            if variant.endswith("raw") and i == 31:
                ratio = 1353.0 if seed == 1 else -250.0 * seed
            rows.append(
                {
                    "run": f"{run}_run",
                    "variant": variant,
                    "seed": seed,
                    "index": i,
                    "theta_init": 1.0,
                    "ratio": ratio,
                }
            )
    fig = drawn(theta_figure(rows))
    check_on_canvas(fig)
    (ax,) = fig.axes
    check_unique_styles(ax)
    lo, hi = ax.get_ylim()
    assert lo < -1250.0 and hi > 1353.0


# ---------------------------------------------------------------- many rows: small multiples

# the rows of docs/results/extrapolation_cpu_all (29 schemes), whose one-panel figures drew 23
# lines between 125 and 165
MANY = [
    "alibi",
    "cope",
    "fire",
    "kerple",
    "learned",
    "nope",
    "rope",
    "sandwich",
    "sinusoidal",
    "t5",
    "xpos",
    "rope randomized N=2048",
    "alibi randomized N=2048",
    "fox",
    "nope, stick-breaking",
    "p_rope",
    "ssmax",
    "hope",
    "resonance",
    "schedule rope/rope/rope/nope",
    "schedule rope/rope/rope/nope, window 32/32/32/global",
    "sinusoidal concatenated (64 of 256 dims)",
    "dape",
    "rope, elementwise gate",
    "pope",
    "rope, sinks",
    "cable",
    "grape",
    "path_attn",
]
FAR_ABOVE = ("sinusoidal", "sinusoidal concatenated (64 of 256 dims)")  # 330-520, as committed


def many_rows() -> list[dict]:
    """Rows of the MANY schemes: perplexities 125-165 (the two sinusoidal rows 330-520), a
    sawtooth loss by position, merged over 3 seeds."""
    rows = []
    for k, scheme in enumerate(MANY):
        for i, n in enumerate(LENGTHS):
            ppl = 125.0 + 1.3 * k + 0.8 * i * (k % 5)
            if scheme in FAR_ABOVE:
                ppl = 330.0 + 40.0 * i + 5.0 * FAR_ABOVE.index(scheme)
            buckets = [[p, math.log(ppl) + 0.3 * (-1) ** (p // 4), 32] for p in range(0, n, 4)]
            rows.append(
                {
                    "scheme": scheme,
                    "mode": "nonoverlapping",
                    "length": n,
                    "train_length": TRAIN,
                    "status": "ok",
                    "loss": math.log(ppl),
                    "ppl": ppl,
                    "ppl_sd": 1.0,
                    "n_seeds": 3,
                    "loss_by_position": buckets,
                }
            )
    return rows


def panels_of(fig) -> list:
    """The visible data panels of a figure (not an empty slot of the grid)."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


def names_in(ax) -> list[str]:
    """The rows a panel draws, from its legend (the best panel's "family: " prefix cut)."""
    names = []
    for t in ax.get_legend().get_texts():
        text = t.get_text().replace("\n", " ")
        if text.startswith("best shortcut"):
            continue
        if ax.get_title() == BEST_TITLE and "(baseline)" not in text:
            text = text.split(": ", 1)[1]
        names.append(text)
    return names


def check_by_family(fig, labels: list[str], baseline: str, suffix: str = "") -> None:
    """One panel per family drawing exactly its family's rows (`suffix` after each name) and
    the baseline, sharing both axes with every other panel, and a last panel of each family's
    best; every text on the canvas, no two lines of a panel alike."""
    from poslab.report.families import panel_groups

    check_on_canvas(fig)
    groups = panel_groups([x for x in labels if x != baseline])
    axes = panels_of(fig)
    assert [ax.get_title() for ax in axes] == [*groups, BEST_TITLE]
    for ax in axes:
        check_unique_styles(ax)
        assert ax.get_shared_x_axes().joined(ax, axes[0])
        assert ax.get_shared_y_axes().joined(ax, axes[0])
        assert len(series_of(ax)) <= 9  # at most MOST_ROWS rows and the baseline
        assert [n for n in names_in(ax) if "(baseline)" in n] == [f"{baseline}{suffix} (baseline)"]
    for ax, (family, members) in zip(axes, groups.items(), strict=False):
        drawn = [n for n in names_in(ax) if "(baseline)" not in n]
        assert len(drawn) == len(members), (family, drawn)
        for member in members:  # the legend may add a note: "(did not learn at L)", "(≈ ...)"
            assert any(n.startswith(member + suffix) for n in drawn), (member, drawn)
    best = [t.get_text().replace("\n", " ") for t in axes[-1].get_legend().get_texts()]
    for family in groups:
        assert sum(b.startswith(f"{family}: ") for b in best) == 1, (family, best)


def test_every_scheme_of_conf_pos_has_a_family_and_labels_find_theirs():
    from pathlib import Path

    from poslab.report.families import OTHER, family_of

    conf = Path(__file__).resolve().parents[2] / "src" / "poslab" / "conf" / "pos"
    schemes = {p.stem for p in conf.glob("*.yaml") if not p.stem.startswith("_")}
    # the schemes poslab ships; a scheme a user adds (one module, one YAML file, its docs row:
    # tests/e2e/test_new_scheme.py) is drawn in the "other" panel until families.py names it
    shipped = set(
        [
            "alibi",
            "cable",
            "cope",
            "dape",
            "fire",
            "fox",
            "grape",
            "hope",
            "kerple",
            "learned",
            "learned2d",
            "mrope",
            "nope",
            "p_rope",
            "path_attn",
            "pope",
            "resonance",
            "rope",
            "rope2d",
            "sandwich",
            "schedule",
            "sinusoidal",
            "ssmax",
            "t5",
            "xpos",
        ]
    )
    assert shipped <= schemes
    assert [s for s in sorted(shipped) if family_of(s) == OTHER] == []
    assert all(isinstance(family_of(s), str) for s in schemes)
    expected = {
        "rope [extrapolation_cpu_all]": "rotary",
        "rope randomized N=512": "rotary",
        "rope, elementwise gate": "rotary",
        "nope, stick-breaking": "data-dependent",
        "schedule rope/nope, window 16/global": "nope & schedules",
        "learned (512-row table)": "absolute",
        "sinusoidal concatenated (16 of 64 dims)": "absolute",
        "rope + yarn s=auto +logn": "rope + interpolation",
        "rope + selfextend G=4 w=L/4": "rope + remapping",
        "rope + position_dtype=bf16": "rotary",
        "nope (DroPE from rope at L=128), 50 steps": "nope & schedules",
        "eval0_ntk": OTHER,
    }
    assert {label: family_of(label) for label in expected} == expected


def test_a_perplexity_figure_of_many_rows_is_drawn_by_family(drawn):
    rows = many_rows()
    figures = dict((k, f) for k, _, f in report_figures(rows, "t", "scheme", "c", None, "rope"))
    fig = drawn(figures["ppl_plot"])
    check_by_family(fig, MANY, "rope")
    axes = panels_of(fig)
    # the far rows are named with their range, off the top of a scale that fits the others
    lo, hi = axes[0].get_ylim()
    assert hi < 200.0 and lo < 125.0
    absolute = next(ax for ax in axes if ax.get_title() == "absolute")
    for scheme in FAR_ABOVE:
        assert any(n.startswith(f"{scheme} (above the scale: 3") for n in names_in(absolute))
    title = fig._suptitle.get_text()
    assert "perplexity" in title and "by family" in title
    # learned, one point at 128 in the committed figure, is a line of its own family's panel
    assert any(ln.get_label() == "learned" for ln in series_of(absolute))


def test_few_rows_keep_the_one_panel_figure(drawn):
    rows = [r for r in many_rows() if r["scheme"] in MANY[:8]]
    figures = dict((k, f) for k, _, f in report_figures(rows, "t", "scheme", "c", None, "rope"))
    fig = drawn(figures["ppl_plot"])
    assert len(panels_of(fig)) == 2  # perplexity and its shape
    assert len(series_of(fig.axes[0])) == 8


def test_loss_by_position_of_many_rows_is_smoothed_and_drawn_by_family(drawn):
    rows = longest_rows(many_rows())
    figures = dict(
        (k, f) for k, _, f in report_figures(many_rows(), "t", "scheme", "c", rows, "rope")
    )
    fig = drawn(figures["position_plot"])
    check_by_family(fig, MANY, "rope", suffix=" L=1024")
    for ax in panels_of(fig):
        for line in series_of(ax):
            xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
            # the buckets alternate ±0.3 every 4 positions (jumps of 0.6); smoothed, the line
            # moves little where a window holds a few buckets, a twelfth of that past 32
            assert np.abs(np.diff(ys[1:])).max() < 0.25, line.get_label()
            assert np.abs(np.diff(ys[xs > 32])).max() < 0.05, line.get_label()
    title = fig._suptitle.get_text()
    assert "loss by position" in title and "perplexity" not in title
    notes = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert "no band over seeds for these rows" in notes  # merged rows without per-seed buckets


def test_loss_by_position_draws_a_band_over_seeds_where_rows_keep_them(drawn):
    from poslab.report.figures import position_figure

    rows = longest_rows(corpus_rows())[:3]
    for r in rows:
        r["per_seed"] = {
            "loss_by_position": {
                str(seed): [[p, m + 0.05 * seed, c] for p, m, c in r["loss_by_position"]]
                for seed in (1, 2, 3)
            }
        }
    fig = drawn(position_figure(rows, "learnable θ: fixed vs learned, 3 seeds"))
    check_on_canvas(fig)
    (ax,) = panels_of(fig)
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 3
    for band in bands:  # ± 1 sd of 0, 0.05, 0.1 around the mean: 0.1 wide
        ys = band.get_paths()[0].vertices[:, 1]
        assert 0.09 < ys.max() - ys.min() < 2.0
    assert "loss by position" in ax.get_title() and "learnable θ" in ax.get_title()


def test_an_accuracy_figure_of_many_rows_is_drawn_by_family_with_the_shortcut(drawn):
    rows = task_rows()
    figures = dict((k, f) for k, _, f in report_figures(rows, "t", "scheme", "c", None, "rope"))
    fig = drawn(figures["accuracy_plot"])
    check_by_family(fig, SCHEMES, "rope")
    for ax in panels_of(fig):
        shortcut = [ln for ln in ax.get_lines() if ln.get_label() == "best shortcut"]
        assert shortcut and list(shortcut[0].get_ydata()) == pytest.approx([0.05] * 5)
        assert ax.get_ylim() == pytest.approx((-0.02, 1.02))
    assert "accuracy" in fig._suptitle.get_text()


def test_a_difference_figure_of_many_rows_is_in_blocks_by_family(drawn):
    from poslab.report.differences import difference_set
    from poslab.report.families import family_of
    from poslab.report.figures import difference_figure

    rows = many_rows()
    fig = drawn(difference_figure(difference_set(rows, "rope", "nonoverlapping"), "t"))
    check_on_canvas(fig)
    short, longest = fig.axes
    assert short.get_shared_y_axes().joined(short, longest)
    ticks = sorted(
        zip(short.get_yticks(), short.get_yticklabels(), strict=True), key=lambda t: -t[0]
    )
    headings = [t.get_text() for _, t in ticks if t.get_fontweight() == "bold"]
    assert headings[0] == BEST_TITLE and len(headings) == 7  # best, then 6 families
    block = None
    for _, tick in ticks:
        text = tick.get_text()
        if tick.get_fontweight() == "bold":
            block = text
        elif block != BEST_TITLE:  # every row under its family's heading
            assert block.startswith(family_of(text.rsplit(" (", 1)[0])), (block, text)
    rows_shown = [t.get_text() for _, t in ticks if t.get_fontweight() != "bold"]
    assert len(rows_shown) == len(MANY) - 1 + 6  # every scheme but rope, and each family's best


def test_titles_say_what_is_drawn(drawn):
    from poslab.report.differences import difference_set
    from poslab.report.figures import difference_figure

    rows = corpus_rows()[: 5 * 4]  # 4 schemes
    found = difference_set(rows, "rope", "nonoverlapping")
    generic = drawn(difference_figure(found, "perplexity vs evaluation length"))
    title = generic._suptitle.get_text().replace("\n", " ")
    assert title.startswith("difference to rope in perplexity (scheme − rope)")
    assert "95% interval over seeds" in title and "perplexity vs evaluation length" not in title
    specific = drawn(difference_figure(found, "Train at L=128, evaluate at 1x-16x"))
    lines = specific._suptitle.get_text().split("\n")
    assert lines[0].startswith("Train at L=128") and "difference to rope" in " ".join(lines[1:])
    ppl = drawn(ppl_figure(rows, "scheme", "Train at L=128, evaluate at 1x-16x"))
    assert "perplexity vs evaluation length" in ppl.axes[0].get_title().replace("\n", " ")
    accuracy = drawn(accuracy_figure(task_rows()[:20], "scheme", "resolution extrapolation"))
    lines = accuracy._suptitle.get_text().split("\n")
    assert lines == [
        "resolution extrapolation",
        "accuracy (whole answer right) vs evaluation length",
    ]


def test_an_interval_of_zero_width_is_drawn_as_an_interval_not_as_one_seed(drawn):
    """rope_scaling's eval-time kinds equal rope at L on every seed: [0, 0] over 3 paired seeds
    was drawn as the open marker the key gives a one-seed row."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import to_rgba

    from poslab.report.differences import DifferenceSet
    from poslab.report.figures import difference_figure
    from poslab.report.intervals import Interval

    found = DifferenceSet(
        "rope",
        "nonoverlapping",
        "ppl",
        [128, 2048],
        {
            "same": [Interval(0.0, 0.0, 0.0, 3), Interval(1.0, -1.0, 3.0, 3)],
            "lower": [Interval(-2.0, -2.0, -2.0, 3), Interval(-3.0, -4.0, -2.0, 3)],
            "alone": [Interval(0.5, None, None, 1), Interval(2.0, None, None, 1)],
        },
        {128: 1.0, 2048: 16.0},
        {128: 130.0, 2048: 150.0},
    )
    fig = drawn(difference_figure(found, "t"))
    short = fig.axes[0]
    y = {
        t.get_text().split(" (")[0]: v
        for v, t in zip(short.get_yticks(), short.get_yticklabels(), strict=True)
    }
    caps = [
        seg
        for c in short.collections
        if isinstance(c, LineCollection)
        for seg in c.get_segments()
        if len(seg) == 2 and seg[0][0] == seg[1][0] and seg[0][1] != seg[1][1]  # vertical
    ]

    def capped(scheme: str) -> list[float]:
        return [s[0][0] for s in caps if min(s[:, 1]) < y[scheme] < max(s[:, 1])]

    assert capped("same") == [0.0, 0.0]  # both ends, at 0, visible through the marker
    assert capped("lower") == [-2.0, -2.0]
    assert capped("alone") == []  # one seed: no interval, the open marker alone
    marks = {
        round(ln.get_ydata()[0]): ln
        for ln in short.get_lines()
        if len(ln.get_ydata()) == 1
        and ln.get_linestyle() == "None"
        and ln.get_marker() not in ("_",)
    }
    lower = marks[round(y["lower"])]
    assert to_rgba(lower.get_markerfacecolor()) == to_rgba(lower.get_color())  # excludes 0
    assert "(3 paired)" in " ".join(t.get_text() for t in short.get_yticklabels())


def test_the_grid_accuracy_baseline_is_its_committed_best_shortcut(drawn):
    """docs/results/grid2d: its rows state no shortcut; the figure reads the committed tables
    of shortcuts.md (what docs/results.md's best-shortcut row is) instead of chance at 0.125."""
    import json
    from pathlib import Path

    from poslab.report.files import with_committed_shortcuts

    folder = Path(__file__).resolve().parents[2] / "docs" / "results" / "grid2d"
    rows = json.loads((folder / "comparison.json").read_text())
    assert not any(r.get("shortcut") for r in rows)
    rows = with_committed_shortcuts(rows, folder / "shortcuts.md")
    fig = drawn(accuracy_figure(rows, "scheme", "resolution extrapolation"))
    check_on_canvas(fig)
    whole, token = fig.axes[:2]
    best = {
        ax: [ln for ln in ax.get_lines() if ln.get_label() == "best shortcut"]
        for ax in (whole, token)
    }
    assert list(best[whole][0].get_xdata()) == [64, 256, 1024]
    assert list(best[whole][0].get_ydata()) == pytest.approx([0.357, 0.39, 0.387], abs=1e-3)
    assert list(best[token][0].get_ydata()) == pytest.approx([0.457, 0.474, 0.473], abs=1e-3)
    assert "best shortcut" in legend_labels(fig)


def test_rows_merged_over_seeds_keep_each_seeds_curve_at_the_longest_length(drawn):
    from poslab.report.figures import position_figure, seed_band
    from poslab.report.seeds import merge_seeds

    one = [r for r in longest_rows(corpus_rows()) if r.get("loss_by_position")][0]
    runs = []
    for seed in (1, 2, 3):
        shifted = [[p, m + 0.05 * seed, c] for p, m, c in one["loss_by_position"]]
        short = {**one, "length": one["length"] // 2, "loss_by_position": shifted}
        runs.append((seed, [short, {**one, "loss_by_position": shifted}]))
    merged = {r["length"]: r for r in merge_seeds(runs, "rope")}
    longest, shorter = merged[one["length"]], merged[one["length"] // 2]
    assert set(longest["per_seed"]["loss_by_position"]) == {"1", "2", "3"}
    assert "loss_by_position" not in shorter["per_seed"]  # only what the figure draws is kept
    band = seed_band(longest)
    assert band and all(0.04 < sd < 0.06 for _, _, sd in band)  # sd of +0.05, +0.10, +0.15
    fig = drawn(position_figure([longest], "one row, 3 seeds"))
    (ax,) = panels_of(fig)
    assert [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_coarse_buckets_keep_every_token_and_the_weighted_mean():
    from poslab.report.seeds import coarse_buckets

    buckets = [[4 * i, 1.0 + 0.01 * i, 100 + i] for i in range(512)]
    coarse = coarse_buckets(buckets)
    assert 50 < len(coarse) < 100  # at most 12 per octave of 0..2047, from 512 buckets
    assert sum(c for _, _, c in coarse) == sum(c for _, _, c in buckets)
    total = sum(m * c for _, m, c in buckets)
    assert sum(m * c for _, m, c in coarse) == pytest.approx(total)
    assert [s for s, _, _ in coarse] == sorted(s for s, _, _ in coarse)


def test_the_budget_figure_gives_rows_orders_of_magnitude_apart_a_log_axis():
    """The sinusoid's +250 beside ALiBi's -35 and T5's +6 (paper_cpu at 300 steps): a symmetric
    log axis whose ticks name plain numbers; ratios 0.95-5 a log axis; close rows stay linear."""
    from poslab.report.budget import spread_axis

    fig, (differences, ratios, close) = plt.subplots(1, 3)
    assert spread_axis(differences, [250.0, -35.0, 6.0], ratio=False) == " (symlog)"
    assert spread_axis(ratios, [0.95, 1.1, 5.0], ratio=True) == " (log)"
    assert spread_axis(close, [0.98, 1.12], ratio=True) == ""
    assert (differences.get_yscale(), ratios.get_yscale(), close.get_yscale()) == (
        "symlog",
        "log",
        "linear",
    )
    differences.set_ylim(-100, 1000)
    fig.canvas.draw()
    labels = [t.get_text() for t in differences.get_yticklabels() if t.get_text()]
    assert "100" in labels and "-10" in labels  # plain numbers, not 10^2
    plt.close(fig)

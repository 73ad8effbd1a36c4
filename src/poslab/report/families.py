"""Which family a result row's scheme belongs to, and the panels of a figure of many rows.

A figure of more than MOST_ROWS rows is drawn as small multiples, one panel per family (the
report's figures, poslab.report.multiples): 29 schemes between perplexity 125 and 165 on one
panel hide each other. A family is looked up by the scheme's name, the first word of a row's
label ("rope randomized N=2048" -> rope, "rope + yarn s=auto" -> rope, "learned (512-row
table)" -> learned); a name not in the table is "other".

The families, by what carries the position (each scheme of conf/pos/ has one; a test checks):

* absolute: a vector added to the token embedding (learned, learned2d, sinusoidal);
* rotary: RoPE's rotation of queries and keys by the token index, as it is or with changes
  that leave the rotation itself alone (the indices of a grid's axes: rope2d, mrope; a softmax
  temperature: ssmax; randomized positions, gates, sinks in the label);
* rotary variants: the rotation itself changed (xpos's decay, p_rope's partial, hope's and
  resonance's frequencies, pope's polar form);
* additive bias: a fixed function of the distance added to the scores (alibi, t5, kerple,
  sandwich, fire);
* data-dependent: a bias or transform computed from the content (fox, cable, dape, cope,
  path_attn, grape; and stick-breaking attention, whatever scheme it is written over);
* nope & schedules: no positions, or a scheme per layer mixing rope and nope layers.

An extension of rope (a label "rope + METHOD ...", poslab/positions/scaling.py) is drawn by
its method's family: interpolation (pi, ntk, dynamic_ntk, yarn, llama3, longrope: the
frequencies rescaled) or remapping (lminfinite, rerope, selfextend, string, dpe: the distances
or the window changed); other "+ ..." options (logn, position_dtype=...) keep the scheme's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

# more rows than this on one panel hide each other: such a figure is drawn by family
MOST_ROWS = 8
OTHER = "other"

FAMILIES: dict[str, tuple[str, ...]] = {
    "absolute": ("learned", "learned2d", "sinusoidal"),
    "rotary": ("rope", "rope2d", "mrope", "ssmax"),
    "rotary variants": ("xpos", "p_rope", "hope", "resonance", "pope"),
    "rope + interpolation": ("pi", "ntk", "dynamic_ntk", "yarn", "llama3", "longrope"),
    "rope + remapping": ("lminfinite", "rerope", "selfextend", "string", "dpe"),
    "additive bias": ("alibi", "t5", "kerple", "sandwich", "fire"),
    "data-dependent": ("fox", "cable", "dape", "cope", "path_attn", "grape", "stick-breaking"),
    "nope & schedules": ("nope", "schedule"),
}
# a small family drawn on its parent's panel when both fit on one (rope beside its variants)
FOLDS = (("rotary variants", "rotary"),)
# the families of a rope extension's method ("rope + yarn s=auto"): drawn by the method's
EXTENSION_FAMILIES = ("rope + interpolation", "rope + remapping")
# an attention that replaces the scheme's positions ("nope, stick-breaking"): its family wins
ATTENTION_MODIFIERS = ("stick-breaking",)

FAMILY_OF = {name: family for family, names in FAMILIES.items() for name in names}


def scheme_name(label: str) -> str:
    """The scheme a row's label starts with: its first word ("rope" of "rope [pos.base=100]",
    "p_rope" of "p_rope", "nope" of "nope, stick-breaking")."""
    found = re.match(r"\s*([A-Za-z0-9_]+)", label)
    return found.group(1).lower() if found else ""


def extension_of(label: str) -> str | None:
    """The rope extension a label names ("yarn" of "rope + yarn s=auto +logn"), else None."""
    found = re.search(r"\+\s*([A-Za-z0-9_]+)", label)
    if found and FAMILY_OF.get(found.group(1).lower()) in EXTENSION_FAMILIES:
        return found.group(1).lower()
    return None


def family_of(label: str) -> str:
    """The family of a row's label (see the module docstring); OTHER for an unknown scheme."""
    for modifier in ATTENTION_MODIFIERS:  # "nope, stick-breaking": the attention carries it
        if re.search(rf",\s*{re.escape(modifier)}\b", label):
            return FAMILY_OF[modifier]
    extension = extension_of(label)
    if extension is not None:
        return FAMILY_OF[extension]
    return FAMILY_OF.get(scheme_name(label), OTHER)


def method_of(label: str) -> str:
    """What splits an overfull family panel: the extension's method, else the scheme's name."""
    return extension_of(label) or scheme_name(label)


def _packed(title: str, labels: list[str], most: int) -> list[tuple[str, list[str]]]:
    """A family of more than `most` rows split into panels of at most `most` rows (a method's
    rows kept together; one method of more rows alone on a panel), each titled with its
    methods: "rope + interpolation (dynamic_ntk, llama3, ntk, pi)"."""
    by_method: dict[str, list[str]] = {}
    for label in labels:
        by_method.setdefault(method_of(label), []).append(label)
    panels: list[tuple[list[str], list[str]]] = []  # (methods, labels)
    for method, members in by_method.items():
        if panels and len(panels[-1][1]) + len(members) <= most:
            panels[-1][0].append(method)
            panels[-1][1].extend(members)
        else:
            panels.append(([method], list(members)))
    if len(panels) == 1:
        return [(title, labels)]
    return [(f"{title} ({', '.join(methods)})", members) for methods, members in panels]


def panel_groups(labels: Iterable[str], most: int = MOST_ROWS) -> dict[str, list[str]]:
    """The panels of a figure by family: panel title -> its labels (in the given order),
    families in the order of FAMILIES, OTHER last; a family folded into its parent's panel
    when both fit on it (FOLDS: "rotary & rotary variants"); a family of more than `most` rows
    split by method (`_packed`)."""
    by_family: dict[str, list[str]] = {}
    for label in labels:
        by_family.setdefault(family_of(label), []).append(label)
    order = [*FAMILIES, OTHER]
    rank = {family: order.index(family) for family in by_family}
    for child, parent in FOLDS:
        both = by_family.get(parent, []) + by_family.get(child, [])
        if child in by_family and parent in by_family and len(both) <= most:
            del by_family[parent], by_family[child]
            by_family[f"{parent} & {child}"] = both
            rank[f"{parent} & {child}"] = order.index(parent)
    panels: dict[str, list[str]] = {}
    for family in sorted(by_family, key=rank.__getitem__):
        members = by_family[family]
        packed = _packed(family, members, most) if len(members) > most else [(family, members)]
        panels.update(packed)
    return panels


def best_of(points: dict[str, Sequence[tuple[float, float]]], lower_is_better: bool) -> str | None:
    """The label whose value is best at the longest length any of them reaches (lowest
    perplexity or loss, highest accuracy); labels that stop shorter rank after, by their own
    longest length. None when no label has a point."""
    sign = 1.0 if lower_is_better else -1.0
    ranked = [
        (-max(x for x, _ in pts), sign * max(pts)[1], label) for label, pts in points.items() if pts
    ]
    return min(ranked)[2] if ranked else None


BEST_TITLE = "best of each family"


class Panel(NamedTuple):
    """One panel of a figure by family: its title, the labels it draws (in order) and each
    one's legend text."""

    title: str
    labels: list[str]
    names: dict[str, str]


def family_panels(
    points: dict[str, Sequence[tuple[float, float]]],
    baselines: Sequence[str],
    lower_is_better: bool,
    most: int = MOST_ROWS,
) -> list[Panel]:
    """The panels of a figure of `points` (label -> (length, value)) by family (panel_groups),
    each with the `baselines` drawn too (for reference, "(baseline)" in the legend), and a last
    panel of each family's best (best_of), "family: label" in the legend."""
    base_names = {b: f"{b} (baseline)" for b in baselines}
    panels: list[Panel] = []
    best: dict[str, str] = {}
    for title, labels in panel_groups([x for x in points if x not in baselines], most).items():
        panels.append(Panel(title, [*labels, *baselines], {**{x: x for x in labels}, **base_names}))
        found = best_of({x: points[x] for x in labels}, lower_is_better)
        if found is not None:
            best[title] = found
    if len(panels) > 1:
        names = {label: f"{title}: {label}" for title, label in best.items()}
        panels.append(Panel(BEST_TITLE, [*best.values(), *baselines], {**names, **base_names}))
    return panels

"""The attention of trained checkpoints, per layer and head: mean attention distance and the mass
on keys at distance ≥ the training length (cli.py's doc)."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from poslab.analysis.checkpoints import checkpoint_path, scheme_name
from poslab.analysis.figures import save
from poslab.errors import ConfigError
from poslab.model.attention import Blockwise
from poslab.plotting import finish_figure, natural_sorted, new_figure, styles_for


@dataclass
class AttentionStats:
    """Per (layer, head) statistics of one forward, and checks of the weights."""

    mean_distance: np.ndarray  # (n_layer, n_head): Σ_n w_mn·(m − n), mean over all queries
    mass_beyond: np.ndarray  # (n_layer, n_head): Σ_{m−n ≥ L} w_mn, mean over queries m ≥ L
    max_row_error: float  # max over queries of |Σ_n w_mn − 1|
    max_future_weight: float  # max weight on a key after its query (0 for causal attention)


class AttentionRecorder(Blockwise):
    """The blockwise kernel (the reference weights, every scheme hook applied) that also records,
    per layer and head, the mean attention distance and the mass on keys at distance ≥ L."""

    name = "recorder"

    def __init__(
        self,
        train_length: int,
        n_layer: int,
        n_head: int,
        block_size: int = 1024,
        window: Any = None,
    ):
        super().__init__(block_size, window)
        self.train_length = train_length
        self.distance_sum = torch.zeros(n_layer, n_head, dtype=torch.float64)
        self.far_sum = torch.zeros(n_layer, n_head, dtype=torch.float64)
        self.queries = torch.zeros(n_layer, dtype=torch.float64)
        self.far_queries = torch.zeros(n_layer, dtype=torch.float64)
        self.max_row_error = 0.0
        self.max_future_weight = 0.0

    def weights(
        self,
        q: Tensor,
        k: Tensor,
        pos: Any,
        prepared: Any,
        layer: int,
        start: int,
        end: int,
        decay: Tensor | None = None,
        sinks: Tensor | None = None,
        data: Any = None,
    ) -> Tensor:
        """Blockwise's weights of one query block (its __call__ runs the blocks), recorded.
        With sinks (model.sinks) a row's weights sum to 1 minus the sink's share, which is
        recorded with them: the check is that the two make 1, and the distance statistics
        count the sink's share as attention to no key."""
        weights = super().weights(q, k, pos, prepared, layer, start, end, decay, sinks, data)
        sink_share = None
        if sinks is not None:
            scores = self.scores(q, k, pos, prepared, layer, start, end, decay, data)
            with torch.autocast(device_type=q.device.type, enabled=False):
                lse = torch.logsumexp(scores, dim=-1)  # (B, H, Tq)
                sink_share = torch.sigmoid(sinks.float()[:, None] - lse)
        self.record(weights, layer, start, end, sink_share)
        return weights

    def record(
        self, weights: Tensor, layer: int, start: int, end: int, sink_share: Tensor | None = None
    ) -> None:
        """Add the statistics of weights (B, H, end − start, end) of queries start..end−1
        (`sink_share` (B, H, end − start): the share each row gave a sink)."""
        w = weights.double()
        m = torch.arange(start, end, device=w.device)[:, None]
        n = torch.arange(end, device=w.device)[None, :]
        distance = (m - n).double()  # (Tq, Tk); negative above the diagonal: future keys
        far = (distance >= self.train_length).double()
        self.distance_sum[layer] += torch.einsum("bhqk,qk->h", w, distance.clamp(min=0)).cpu()
        self.far_sum[layer] += torch.einsum("bhqk,qk->h", w, far).cpu()
        self.queries[layer] += w.shape[0] * (end - start)
        self.far_queries[layer] += w.shape[0] * max(0, end - max(start, self.train_length))
        total = w.sum(-1) + (0 if sink_share is None else sink_share.double())
        self.max_row_error = max(self.max_row_error, float((total - 1).abs().max()))
        future = (distance < 0).expand_as(w)
        if future.any():
            self.max_future_weight = max(self.max_future_weight, float(w[future].abs().max()))

    def stats(self) -> AttentionStats:
        far = self.far_queries[:, None]
        mass = torch.where(far > 0, self.far_sum / far.clamp(min=1), torch.nan)
        return AttentionStats(
            (self.distance_sum / self.queries[:, None].clamp(min=1)).numpy(),
            mass.numpy(),
            self.max_row_error,
            self.max_future_weight,
        )


def attention_statistics(
    model: Any, ids: Tensor, train_length: int, block_size: int = 1024
) -> AttentionStats:
    """Run `model` (fp32, inference mode) on token ids (B, T) with the recording kernel installed
    as model.attention (checked against the scheme first), then put its kernel back. A model
    whose attention is not softmax has no softmax weights to record: a ConfigError."""
    if not model.attention.softmax:
        raise ConfigError(
            f"attention={model.attention.name}: the model has no softmax attention weights to "
            "measure; the attention analysis takes softmax checkpoints"
        )
    window = model.attention.window  # a sliding window is part of the model: kept
    recorder = AttentionRecorder(
        train_length, model.config.n_layer, model.config.n_head, block_size, window
    )
    recorder.check(model.pos, 0.0)
    original = model.attention
    model.attention = recorder
    try:
        with torch.inference_mode():
            model.float().hidden_states(ids)
    finally:
        model.attention = original
    return recorder.stats()


def uniform_reference(length: int, train_length: int) -> tuple[float, float]:
    """(mean distance, mass beyond L) of uniform causal attention over `length` tokens."""
    m = np.arange(length, dtype=np.float64)
    past = m[m >= train_length]
    mass = float(np.mean((past - train_length + 1) / (past + 1))) if past.size else math.nan
    return float(np.mean(m / 2)), mass


class UnsupportedLength(ConfigError):
    """The scheme cannot represent the analysed length (learned positions beyond their table)."""


def check_attention_input(path: str | Path, factor: float, data_path: str | None) -> None:
    """What would stop the attention analysis of one checkpoint, found before any model runs
    (and before the output folder is made): a checkpoint of a generated task (no corpus to run
    on), windows too short to hold a query and a key, a corpus that is gone."""
    from poslab.model.build import read_checkpoint

    ckpt = checkpoint_path(path)
    data = read_checkpoint(ckpt)["hyper_parameters"]["config"].get("data") or {}
    if data.get("task"):
        raise ConfigError(
            f"{path} was trained on the generated task data={data.get('name')}, not on a text "
            "corpus: the attention analysis runs a model on windows of its training corpus; pass "
            "checkpoints trained on text (data=text, wikitext2 or wikitext103)"
        )
    train_length = int(data["seq_len"])
    if round(factor * train_length) < 2:
        raise ConfigError(
            f"--factor {factor:g} × the training length {train_length} of {path} is fewer than "
            "2 tokens, no window to measure; raise --factor"
        )
    stored = data.get("path")
    if data_path is None and stored and not Path(str(stored)).expanduser().exists():
        raise ConfigError(
            f"{path} was trained on data.path={stored}, which does not exist any more; pass that "
            "corpus with --data-path DIR"
        )


def validation_windows(
    config: dict[str, Any],
    length: int,
    windows: int,
    split: str = "validation",
    data_path: str | None = None,
    vocab_size: int | None = None,
) -> Tensor:
    """(windows, length) token ids of the run's corpus, windows spread evenly over the split."""
    from poslab.data.cache import TokenCache

    overrides = {"path": data_path} if data_path else {}
    cache = TokenCache.from_config(config["data"], **overrides)
    if vocab_size is not None and cache.meta()["vocab_size"] != vocab_size:
        raise ConfigError(
            f"the token cache {cache.folder} has a vocabulary of {cache.meta()['vocab_size']} "
            f"but the checkpoint was trained with {vocab_size}; pass the corpus it was trained "
            "on (--data-path) with the same tokenizer settings"
        )
    ids = np.asarray(cache.split(split).ids, dtype=np.int64)
    if len(ids) < length:
        raise ConfigError(
            f"the {split} split has {len(ids)} tokens, fewer than one window of {length}; "
            "lower --factor"
        )
    starts = np.linspace(0, len(ids) - length, windows).round().astype(np.int64)
    return torch.from_numpy(np.stack([ids[s : s + length] for s in starts]))


def analyse_checkpoint(
    path: str | Path,
    factor: float = 4.0,
    windows: int = 4,
    split: str = "validation",
    data_path: str | None = None,
    block_size: int = 1024,
) -> list[dict]:
    """One row per (layer, head) of a checkpoint (see cli.py's doc). A scheme that cannot
    represent the length (learned positions beyond their table) is a ConfigError."""
    from poslab.model.build import load_checkpoint

    ckpt = checkpoint_path(path)
    model, config = load_checkpoint(ckpt)
    train_length = int(config["data"]["seq_len"])
    length = round(factor * train_length)
    try:
        model.pos.check_length(length - 1)
    except ConfigError as err:
        raise UnsupportedLength(f"{scheme_name(config)} at T={length}: {err}") from None
    ids = validation_windows(config, length, windows, split, data_path, model.config.vocab_size)
    stats = attention_statistics(model, ids, train_length, block_size)
    if stats.max_row_error > 1e-4 or stats.max_future_weight > 0:
        raise RuntimeError(
            f"{ckpt}: attention weights are not causal probabilities (row sums off by "
            f"{stats.max_row_error:.2g}, future weight {stats.max_future_weight:.2g})"
        )
    run = ckpt.parent.parent.name if ckpt.parent.name == "checkpoints" else ckpt.stem
    return [
        {
            "scheme": scheme_name(config),
            "run": run,
            "checkpoint": str(ckpt),
            "train_length": train_length,
            "eval_length": length,
            "windows": windows,
            "split": split,
            "layer": layer,
            "head": head,
            "mean_distance": float(stats.mean_distance[layer, head]),
            "mass_beyond_L": float(stats.mass_beyond[layer, head]),
        }
        for layer in range(stats.mean_distance.shape[0])
        for head in range(stats.mean_distance.shape[1])
    ]


METRICS = (
    ("mean_distance", "mean attention distance (tokens)"),
    ("mass_beyond_L", "attention mass at distance ≥ L"),
)


def run_attention(
    out: Path,
    paths: list[str],
    factor: float,
    windows: int,
    split: str,
    data_path: str | None,
    block_size: int,
) -> list[dict]:
    rows = attention_rows(paths, factor, windows, split, data_path, block_size)
    save(attention_figure(rows), rows, out, "attention")
    return rows


def attention_figure(rows: list[dict]) -> Figure:
    """Per metric a panel against the layer: one line per scheme (the mean over heads, in
    natural order, each in a style of its own) and a dot per head; from the rows (attention.csv;
    an older file without a `split` column is titled without it)."""
    fig = new_figure(11.5, 4.4)
    axes = fig.subplots(1, 2)
    schemes = natural_sorted(dict.fromkeys(r["scheme"] for r in rows))
    styles = styles_for(schemes)
    handles = []
    for k, scheme in enumerate(schemes):
        shift = 0.05 * (k - (len(schemes) - 1) / 2)  # heads' dots side by side, not on top
        mine = [r for r in rows if r["scheme"] == scheme]
        handles.append(_draw_scheme(axes, mine, shift, styles[scheme]))
    lengths = {(int(r["eval_length"]), int(r["train_length"])) for r in rows}
    if len(lengths) == 1:
        ((length, train_length),) = lengths
        handles += _draw_uniform(axes, length, train_length)
        windows = ", ".join(sorted({str(r["windows"]) for r in rows}))
        splits = {r.get("split") for r in rows}
        text = f"{splits.pop()} text" if len(splits) == 1 and None not in splits else "text"
        fig.suptitle(
            f"Attention on {text} at T = {length} = {length / train_length:g}× L "
            f"(L = {train_length}, {windows} windows): line = mean over heads, dots = heads",
            fontsize=10,
        )
    for ax, (_, label) in zip(axes, METRICS, strict=True):
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    return finish_figure(fig, handles, [h.get_label() for h in handles])


def attention_rows(
    paths: list[str],
    factor: float,
    windows: int,
    split: str,
    data_path: str | None,
    block_size: int,
) -> list[dict]:
    """The rows of every checkpoint (every path checked before any model runs); of several, one
    whose scheme cannot represent the length is skipped with a note on stderr."""
    for p in paths:
        check_attention_input(p, factor, data_path)
    rows: list[dict] = []
    for p in paths:
        try:
            rows += analyse_checkpoint(p, factor, windows, split, data_path, block_size)
        except UnsupportedLength as err:
            if len(paths) == 1:
                raise
            print(f"skipped {p}: {err}", file=sys.stderr, flush=True)
    if not rows:
        raise ConfigError(f"no checkpoint could be analysed at {factor:g}× its training length")
    names = [r["scheme"] for r in rows if r["layer"] == 0 and r["head"] == 0]
    for r in rows:  # two runs of one scheme: tell them apart by run folder
        if names.count(r["scheme"]) > 1:
            r["scheme"] = f"{r['scheme']} [{r['run']}]"
    return rows


def _draw_scheme(axes: Any, mine: list[dict], shift: float, style: dict[str, Any]) -> Any:
    """One scheme's rows: per metric a line of the mean over heads per layer, a dot per head
    (in the line's colour and marker); returns the line."""
    scheme = mine[0]["scheme"]
    layers = sorted({int(r["layer"]) for r in mine})
    means = {
        key: [np.mean([float(r[key]) for r in mine if int(r["layer"]) == la]) for la in layers]
        for key, _ in METRICS
    }
    for ax, (key, _) in zip(axes, METRICS, strict=True):
        (line,) = ax.plot(layers, means[key], label=scheme, **style)
        heads = ([int(r["layer"]) + shift for r in mine], [float(r[key]) for r in mine])
        ax.scatter(*heads, s=10, alpha=0.35, color=style["color"], marker=style["marker"])
    summary = "; ".join(
        f"layer {la}: distance {d:.1f}, mass ≥L {m:.3f}"
        for la, d, m in zip(layers, means["mean_distance"], means["mass_beyond_L"], strict=True)
    )
    length, train_length = mine[0]["eval_length"], mine[0]["train_length"]
    print(f"attention {scheme} (L={train_length}, T={length}): {summary}")
    return line


def _draw_uniform(axes: Any, length: int, train_length: int) -> list[Any]:
    uniform = uniform_reference(length, train_length)
    lines = [
        ax.axhline(value, color="grey", ls="--", lw=0.8, label="uniform causal attention")
        for ax, value in zip(axes, uniform, strict=True)
    ]
    print(
        f"uniform causal attention at T={length}, L={train_length}: distance "
        f"{uniform[0]:.1f}, mass ≥L {uniform[1]:.3f}"
    )
    return lines[:1]

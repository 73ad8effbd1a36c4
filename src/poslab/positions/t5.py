"""T5 relative position bias (Raffel et al. 2020): a learned scalar per head and distance bucket.

Distances are bucketed causally: exact buckets for small distances, logarithmic ones up to
`max_distance`, and everything farther shares the last bucket. One table serves all layers (as in
T5), or one per layer with `per_layer=true`.

`max_distance: auto` sets it to a quarter of the training length (at least one past the exact
buckets): T5's and the ALiBi paper's 128 at L = 512. The fraction of training query–key pairs in
the last bucket then stays what it is there (~60%) at any L; a fixed 128 at L = 128 leaves that
bucket 1.5% of the training pairs but 89% of a 16× window's (`scripts/analysis.py t5`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from poslab.checks import boolean, integer, require
from poslab.errors import ConfigError
from poslab.positions.base import PositionalScheme


def t5_bucket(distance: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Causal bucket index for `distance` = q_pos - k_pos (negative distances map to bucket 0)."""
    d = distance.float().clamp(min=0)
    max_exact = num_buckets // 2
    # log-spaced buckets from max_exact up to max_distance, computed in fp32
    log_ratio = torch.log(d.clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    log_bucket = max_exact + (log_ratio * (num_buckets - max_exact)).to(torch.long)
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return torch.where(d < max_exact, d.to(torch.long), log_bucket)


def auto_max_distance(train_length: int | None, num_buckets: int) -> int:
    """`max_distance: auto`: L/4 (the paper's 128 at L = 512), at least num_buckets/2 + 1."""
    if train_length is None:
        raise ConfigError(
            "pos.max_distance=auto needs pos.train_length (conf/pos/t5.yaml sets it to "
            "${data.seq_len}); set it, or give pos.max_distance a number"
        )
    return max(train_length // 4, num_buckets // 2 + 1)


class T5Bias(PositionalScheme):
    needs = "bias"
    shift_invariant: ClassVar[bool] = True

    def __init__(
        self,
        d_model: int,
        n_head: int,
        num_buckets: int = 32,
        max_distance: int | str = 128,
        per_layer: bool = False,
        train_length: int | None = None,
        **common: Any,
    ) -> None:
        super().__init__(d_model, n_head, **common)
        require("pos.per_layer", per_layer, boolean())
        require("pos.num_buckets", num_buckets, integer(2))
        require("pos.train_length", train_length, integer(1, null=True))
        if max_distance == "auto":
            max_distance = auto_max_distance(train_length, num_buckets)
        require("pos.max_distance", max_distance, integer(1))
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ConfigError(
                f"t5 needs pos.num_buckets ≥ 2 and pos.max_distance > num_buckets/2 (the exact "
                f"buckets); got num_buckets={num_buckets}, max_distance={max_distance}"
            )
        self.num_buckets = int(num_buckets)
        self.max_distance = int(max_distance)
        # one table shared by all layers (T5's choice), or one per layer with per_layer=true;
        # zero init: training starts with no positional preference (the causal mask alone)
        self.per_layer = per_layer
        tables = self.n_layer if per_layer else 1
        self.bias = nn.Parameter(torch.zeros(tables, self.num_buckets, n_head))

    def upgrade_state(self, state: dict[str, Tensor], prefix: str = "pos.") -> dict[str, Tensor]:
        state = super().upgrade_state(state, prefix)
        old = state.pop(prefix + "bias.weight", None)  # before per_layer: an nn.Embedding
        if old is not None:
            state[prefix + "bias"] = old[None]
        return state

    def score_bias(
        self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0
    ) -> Tensor:
        return self.flex_score_bias(layer)(head, q_position, k_position)

    def flex_score_bias(self, layer: int = 0) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
        table = self.bias[self.layer_index(layer)].float()  # (buckets, H), indexed once

        def bias(head: Tensor, q_position: Tensor, k_position: Tensor) -> Tensor:
            bucket = t5_bucket(q_position - k_position, self.num_buckets, self.max_distance)
            return table[bucket, head]

        return bias

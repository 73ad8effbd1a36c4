"""A scheme per layer: Llama 4's NoPE layers among RoPE layers, Cohere's RNoPE.

`layers` names a scheme of conf/pos/ per layer, as a pattern repeated over the model's layers
(layer i uses layers[i mod len]): `[rope, rope, rope, nope]` is Llama 4's interleaving (every
4th layer without positions), `[rope, nope]` alternates. Every scheme named once is built once
with its YAML defaults (and `options.<name>` over them), so the RoPE layers of a schedule share
one rotary module as a plain rope model does. Each hook goes to the layer's scheme; the kernel
serves each layer what it needs (`layer_needs`), and the model as a whole the most demanding.

A sliding window per layer is the kernel's option: RNoPE-SWA (Yang et al. 2025, 2501.18795),
windowed RoPE layers and global NoPE layers, is `pos.layers=[rope,rope,rope,nope]
attention.window=[W,W,W,null]` (experiment=rnope_swa).

Only schemes acting inside attention can be scheduled: one that adds positions to the token
embeddings (learned, sinusoidal) acts once, before the first layer, and a multi-axis scheme
takes positions of another shape; both are refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from poslab.errors import ConfigError
from poslab.instantiate import instantiate_checked
from poslab.positions.base import NEEDS, PositionalScheme, Prepared


class Schedule(PositionalScheme):
    shift_invariant = True  # the default pattern's schemes (rope, nope) are; see __init__

    def __init__(
        self,
        d_model: int,
        n_head: int,
        layers: Sequence[str] = ("rope", "nope"),
        options: Mapping[str, Mapping[str, Any]] | None = None,
        train_length: int = 64,
        **common: Any,
    ) -> None:
        # built without a model (registry, probes: n_layer not given), the pattern is the model
        known_depth = "n_layer" in common
        super().__init__(d_model, n_head, **common)
        from poslab.positions import scheme_configs  # the registry sits above the schemes

        if isinstance(layers, str) or not isinstance(layers, Sequence) or not layers:
            raise ConfigError(f"pos.layers={layers!r}; give a list of schemes, e.g. [rope,nope]")
        layers = [str(name) for name in layers]
        if not known_depth:
            self.n_layer = len(layers)
        if len(layers) > self.n_layer:
            raise ConfigError(
                f"pos.layers has {len(layers)} entries for a model of {self.n_layer} layers; "
                f"give at most {self.n_layer} (a shorter pattern repeats)"
            )
        configs = scheme_configs(train_length)
        options = dict(options or {})
        unused = [name for name in options if name in configs and name not in layers]
        if unused:  # options of a scheme no layer runs were ignored without a word (#43)
            raise ConfigError(
                f"pos.options.{unused[0]}: {unused[0]} is in no layer of pos.layers="
                f"[{','.join(layers)}]; add it to pos.layers or drop its options"
            )
        for name in [*layers, *options]:
            if name not in configs or name == "schedule":
                known = ", ".join(n for n in configs if n != "schedule")
                raise ConfigError(
                    f"pos.layers: no scheme {name!r} to schedule; choose from {known}"
                )
        members = {}
        for name in dict.fromkeys(layers):
            config = {**configs[name], **dict(options.get(name) or {})}
            config.pop("train_length", None) if "train_length" not in config else None
            member = instantiate_checked(
                config, d_model=d_model, n_head=n_head, n_layer=self.n_layer
            )
            if type(member).embed is not PositionalScheme.embed or member.position_axes:
                raise ConfigError(
                    f"pos.layers: {name} adds positions to the token embeddings or reads several "
                    "position axes, once for the whole model, not per layer; schedule schemes "
                    "that act inside attention (rope, nope, alibi, t5, fox, ...)"
                )
            members[name] = member
        self.pattern = layers
        self.members = nn.ModuleDict(members)
        self.per_layer = True  # the kernel builds each layer's bias for its own scheme
        self.needs = max((m.needs for m in members.values()), key=NEEDS.index)
        self.shift_invariant = all(type(m).shift_invariant for m in members.values())
        self.reads_positions = any(type(m).reads_positions for m in members.values())
        # a kernel that refuses wide q and k (linear attention, PoPE's) refuses the schedule
        self.widens_keys = any(type(m).widens_keys for m in members.values())

    def member(self, layer: int) -> PositionalScheme:
        return self.members[self.pattern[layer % len(self.pattern)]]

    def _prepared_for(self, positions: Tensor | Prepared, layer: int) -> Prepared:
        name = self.pattern[layer % len(self.pattern)]
        return self.prepared(positions).extra["members"][name]

    # -- hooks, each to the layer's scheme -----------------------------------------------------

    def prepare(self, positions: Tensor) -> Prepared:
        prepared = super().prepare(positions)
        prepared.extra["members"] = {n: m.prepare(positions) for n, m in self.members.items()}
        return prepared

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | Prepared, layer: int = 0):  # noqa: ANN201
        return self.member(layer).rotate(q, k, self._prepared_for(positions, layer), layer)

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, layer: int = 0) -> Tensor:
        return self.member(layer).attention_bias(q_positions, k_positions, layer)

    def score_bias(self, head: Tensor, q_position: Tensor, k_position: Tensor, layer: int = 0):  # noqa: ANN201
        member = self.member(layer)
        return member.score_bias(head, q_position, k_position, member.layer_index(layer))

    def flex_score_bias(self, layer: int = 0):  # noqa: ANN201
        member = self.member(layer)
        return member.flex_score_bias(member.layer_index(layer))

    def modify_scores(self, scores, q, k, future, q_positions, k_positions, layer=0, data=None):  # noqa: ANN001, ANN201
        member = self.member(layer)
        return member.modify_scores(scores, q, k, future, q_positions, k_positions, layer, data)

    def layer_data(self, x: Tensor, layer: int = 0) -> Any:
        return self.member(layer).layer_data(x, layer)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, data: Any, layer: int = 0) -> Tensor | None:
        return self.member(layer).attend(q, k, v, data, layer)

    def data_decay(self, x: Tensor, layer: int = 0) -> Tensor | None:
        return self.member(layer).data_decay(x, layer)

    def layer_needs(self, layer: int) -> str:
        return self.member(layer).needs

    # -- checks and logs -----------------------------------------------------------------------

    @property
    def scales_scores(self) -> bool:
        return any(m.scales_scores for m in self.members.values())

    @property
    def reads_length(self) -> bool:
        return any(m.reads_length for m in self.members.values())

    def check_length(self, max_position: int) -> None:
        for member in self.members.values():
            member.check_length(max_position)

    def metrics(self) -> dict[str, Tensor]:
        return {f"{n}/{k}": v for n, m in self.members.items() for k, v in m.metrics().items()}

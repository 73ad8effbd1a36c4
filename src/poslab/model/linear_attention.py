"""Causal linear attention (`attention=linear`), and how RoPE enters it (RoFormer, §3.3).

With a non-negative feature map φ the attention of query m is

    out_m = Σ_{n≤m} s(m, n) v_n / Σ_{n≤m} s(m, n),     s(m, n) = φ(q_m)·φ(k_n),

which prefix sums compute without a T×T matrix: S_m = Σ_{n≤m} φ(k_n) v_nᵀ and z_m = Σ_{n≤m} φ(k_n).
Here the sums run over chunks of `chunk_size` tokens (within a chunk a small masked matrix,
across chunks the running S and z), in fp32 whatever the autocast dtype: memory linear in T.

Positions. A scheme that adds to the embeddings (learned, sinusoidal) needs nothing more. A
scheme that acts on q and k (rope, xpos) cannot act before φ: φ(R_m q)·φ(R_n k) is not a function
of m − n. Su's proposal (the RoFormer paper's eq. 19, `similarity: feature`) rotates the features
instead, in the numerator only:

    out_m = Σ (R_m φ(q_m))·(R_n φ(k_n)) v_n / Σ φ(q_m)·φ(k_n)

so the numerator depends on positions through m − n alone and the denominator stays positive.
The weights no longer sum to 1 and can be negative; and since |R_m a · R_n b| ≤ |a||b| while
a·b can be much smaller, the ratio is unbounded when a query's features are nearly orthogonal to
every key's. The guard: the denominator is clamped at `eps` (relative to nothing: the features
of elu+1 are > 0, so it only binds for relu features or a degenerate cosine similarity).

His second proposal (`similarity: cosine`): s(m, n) = 1 + (R_m q̂_m)·(R_n k̂_n) with q̂ = q/|q|,
k̂ = k/|k|. Rotations keep unit vectors unit, so s ∈ [0, 2]: one similarity, rotated, in both the
numerator and the denominator; linear through the features [1, R q̂] and [1, R k̂]. It is 0 only for
exactly opposite vectors, where the clamp applies (e.g. the first token, if q̂_0 = −k̂_0).

Schemes that need the score matrix (a bias or a change of the scores: alibi, t5, kerple, fire,
sandwich, cope) have nothing to act on here: a one-line ConfigError when the model is built.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.model.attention import AttentionKernel

FEATURE_MAPS: dict[str, Callable[[Tensor], Tensor]] = {
    "elu1": lambda x: F.elu(x) + 1.0,  # Katharopoulos et al. 2020: > 0 everywhere
    "relu": F.relu,  # ≥ 0; all-zero features hit the denominator's clamp
    "softplus": F.softplus,  # > 0, smooth
}
SIMILARITIES = ("feature", "cosine")


def causal_linear_attention(
    q_num: Tensor,
    k_num: Tensor,
    q_den: Tensor,
    k_den: Tensor,
    v: Tensor,
    chunk_size: int = 64,
    eps: float = 1e-6,
) -> Tensor:
    """out_m = Σ_{n≤m} (q_num_m·k_num_n) v_n / max(Σ_{n≤m} q_den_m·k_den_n, eps), for features
    (B, H, T, F) and values (B, H, T, D); fp32 throughout, returned in v's dtype."""
    out_dtype = v.dtype
    acc = torch.promote_types(v.dtype, torch.float32)  # fp32 at least (fp64 stays: tests)
    with torch.autocast(device_type=v.device.type, enabled=False):
        q_num, k_num, q_den, k_den, v = (t.to(acc) for t in (q_num, k_num, q_den, k_den, v))
        batch, heads, seq_len, _ = q_num.shape
        state = q_num.new_zeros(batch, heads, k_num.shape[-1], v.shape[-1])  # Σ k_num v^T
        total = q_den.new_zeros(batch, heads, k_den.shape[-1])  # Σ k_den
        lower = torch.ones(chunk_size, chunk_size, device=v.device).tril()
        outputs = []
        for start in range(0, seq_len, chunk_size):
            end = min(start + chunk_size, seq_len)
            mask = lower[: end - start, : end - start]
            qn, kn, qd, kd, vc = (t[:, :, start:end] for t in (q_num, k_num, q_den, k_den, v))
            numerator = qn @ state + ((qn @ kn.transpose(-1, -2)) * mask) @ vc
            denominator = qd @ total.unsqueeze(-1) + ((qd @ kd.transpose(-1, -2)) * mask).sum(
                -1, keepdim=True
            )
            outputs.append(numerator / denominator.clamp_min(eps))
            # not in place: the earlier chunks' graph holds the previous state
            state = state + kn.transpose(-1, -2) @ vc
            total = total + kd.sum(dim=-2)
        return torch.cat(outputs, dim=2).to(out_dtype)


class Linear(AttentionKernel):
    """`attention=linear`: causal linear attention; rotating schemes act on the features (see
    the module doc). Serves schemes that need nothing from the kernel."""

    name = "linear"
    serves = ("nothing",)
    has_dropout = False
    softmax = False
    rotates_inside = True  # the model leaves q, k as they are; rotation happens after φ

    def __init__(
        self,
        feature_map: str = "elu1",
        similarity: str = "feature",
        chunk_size: int = 64,
        eps: float = 1e-6,
        block_size: int = 1024,
    ) -> None:
        super().__init__(block_size)
        if feature_map not in FEATURE_MAPS:
            raise ConfigError(
                f"attention.feature_map={feature_map}; choose one of {', '.join(FEATURE_MAPS)}"
            )
        if similarity not in SIMILARITIES:
            raise ConfigError(
                f"attention.similarity={similarity}; choose one of {', '.join(SIMILARITIES)}"
            )
        require("attention.chunk_size", chunk_size, integer(1))
        if not isinstance(eps, int | float) or not 0 < eps < 1:
            raise ConfigError(f"attention.eps={eps} must be a number in (0, 1)")
        self.feature_map = feature_map
        self.phi = FEATURE_MAPS[feature_map]
        self.similarity = similarity
        self.chunk_size = chunk_size
        self.eps = float(eps)

    @classmethod
    def row_label(cls, options: dict[str, Any]) -> str:
        similarity = options.get("similarity", "feature")
        return "linear attention" + (f" ({similarity})" if similarity != "feature" else "")

    def check(self, pos: Any, dropout: float, sinks: bool = False) -> None:
        self.check_sinks(sinks)
        if pos.widens_keys:
            raise ConfigError(
                f"attention=linear cannot serve pos={type(pos).__name__}: its q and k become "
                "complex numbers (twice the head's dims) whose phases linear attention's feature "
                "map would not keep; use attention=sdpa or attention=blockwise"
            )
        if pos.needs != "nothing":
            raise ConfigError(
                f"attention=linear cannot serve pos={type(pos).__name__}, which needs the "
                f"{pos.needs}: linear attention never forms the score matrix that a bias or a "
                "change of the scores acts on; use a scheme that acts on the embeddings or "
                "rotates q and k (one that needs nothing from the kernel), or attention=sdpa"
            )
        if pos.scales_scores:
            raise ConfigError(
                f"attention=linear cannot take the temperature of pos={type(pos).__name__} "
                "(SSMax's s·log n, eval.logn_scaling or yarn's attention factor): it scales "
                "softmax scores, and here it would scale only the numerator; leave them off"
            )
        super().check(pos, dropout, sinks)

    def features(
        self, q: Tensor, k: Tensor, pos: Any, prepared: Any, layer: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(numerator query, numerator key, denominator query, denominator key) features, in
        fp32 at least."""
        acc = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(acc), k.to(acc)
        if self.similarity == "cosine":
            q_hat, k_hat = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
            q_rot, k_rot = pos.rotate(q_hat, k_hat, prepared, layer)
            q_feat = torch.cat([q_rot.new_ones(*q_rot.shape[:-1], 1), q_rot], dim=-1)
            k_feat = torch.cat([k_rot.new_ones(*k_rot.shape[:-1], 1), k_rot], dim=-1)
            return q_feat, k_feat, q_feat, k_feat
        q_phi, k_phi = self.phi(q), self.phi(k)
        q_rot, k_rot = pos.rotate(q_phi, k_phi, prepared, layer)  # identity for most schemes
        return q_rot, k_rot, q_phi, k_phi

    def __call__(
        self, q, k, v, pos, prepared, state, layer, dropout_p, decay=None, sinks=None, data=None
    ):  # noqa: ANN001
        q_num, k_num, q_den, k_den = self.features(q, k, pos, prepared, layer)
        return causal_linear_attention(q_num, k_num, q_den, k_den, v, self.chunk_size, self.eps)

"""Gated attention (model.gate) and attention sinks (model.sinks): model options that combine
with any scheme, checked against a float64 transcription of their definitions.

- Gate (Qiu et al. 2025, arXiv 2505.06708, G1; qiuzh20/gated_attention): each head's attention
  output times σ(x W_g + b), x the layer's normalised input, one gate per head or per dimension,
  before the output projection.
- Sinks (gpt-oss's reference `sdpa`): the scaled, masked scores of each query with the head's
  sink logit appended as one more column, softmax over them, the sink's column dropped, then
  the weights times the values.
"""

from __future__ import annotations

import math

import pytest
import torch

from poslab.errors import ConfigError
from poslab.model.attention import SDPA, Auto, Blockwise, Flex, StickBreaking
from poslab.model.build import build_scheme
from poslab.model.gpt import GPT, GPTConfig
from poslab.model.linear_attention import Linear as LinearAttention

SCHEMES = {
    "rope": {"_target_": "poslab.positions.rope.Rotary"},
    "alibi": {"_target_": "poslab.positions.alibi.ALiBi"},
    "nope": {"_target_": "poslab.positions.nope.NoPositions"},
}
KERNELS = {
    "sdpa": lambda: SDPA(),
    "sdpa in blocks": lambda: SDPA(block_size=3, full_bias_mib=0),
    "blockwise": lambda: Blockwise(),
    "blockwise in blocks": lambda: Blockwise(block_size=3),
    "auto": lambda: Auto(),
}


def model(scheme: str, kernel, gate=None, sinks=False) -> GPT:  # noqa: ANN001
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=8, gate=gate, sinks=sinks)
    gpt = GPT(config, build_scheme(SCHEMES[scheme], config), kernel).double()
    attn = gpt.blocks[0].attn
    if sinks:  # away from their zero start, different per head
        with torch.no_grad():
            attn.sinks.copy_(torch.tensor([0.7, -1.3], dtype=torch.float64))
    return gpt


def reference(gpt: GPT, x: torch.Tensor) -> torch.Tensor:
    """The layer's output, transcribed from the definitions in float64."""
    attn, pos = gpt.blocks[0].attn, gpt.pos
    batch, seq_len, d_model = x.shape
    heads, head_dim = attn.n_head, d_model // attn.n_head
    q, k, v = (
        t.view(batch, seq_len, heads, head_dim).transpose(1, 2)
        for t in (x @ attn.qkv.weight.T + attn.qkv.bias).split(d_model, dim=-1)
    )
    positions = torch.arange(seq_len)
    q, k = pos.rotate(q, k, positions)
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    if pos.needs == "bias":
        scores = scores + pos.attention_bias(positions, positions).double()
    future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(future, -math.inf)
    if attn.sinks is not None:  # gpt-oss: the sink column last, dropped after the softmax
        column = attn.sinks.view(1, heads, 1, 1).expand(batch, heads, seq_len, 1)
        weights = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    y = (weights @ v).transpose(1, 2)  # (B, T, H, head_dim)
    if attn.gate is not None:
        gate = torch.sigmoid(x @ attn.gate.weight.T + attn.gate.bias)
        y = y * gate.view(batch, seq_len, heads, -1)
    return y.reshape(batch, seq_len, d_model) @ attn.proj.weight.T + attn.proj.bias


def layer_output(gpt: GPT, x: torch.Tensor) -> torch.Tensor:
    prepared = gpt.pos.prepare(torch.arange(x.shape[1]))
    state = gpt.attention.begin(gpt.pos, prepared, x.dtype)
    return gpt.blocks[0].attn(x, prepared, gpt.pos, gpt.attention, state, 0)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("gate,sinks", [("headwise", True), ("elementwise", False), (None, True)])
def test_values_and_gradients_equal_the_transcription(scheme, kernel, gate, sinks):
    gpt = model(scheme, KERNELS[kernel](), gate, sinks)
    # blockwise computes its scores in fp32 by design (the reference kernel); sdpa in the dtype
    # it is given, float64 here
    tolerance = (
        {"rtol": 1e-5, "atol": 1e-6} if "blockwise" in kernel else {"rtol": 1e-10, "atol": 1e-12}
    )
    x = torch.randn(2, 7, 8, dtype=torch.float64, requires_grad=True)
    ours, theirs = layer_output(gpt, x), reference(gpt, x)
    torch.testing.assert_close(ours, theirs, **tolerance, check_dtype=False)
    weights = list(gpt.blocks[0].attn.parameters())
    grad_ours = torch.autograd.grad(ours.square().sum(), [x, *weights])
    grad_theirs = torch.autograd.grad(theirs.square().sum(), [x, *weights])
    for a, b in zip(grad_ours, grad_theirs, strict=True):
        torch.testing.assert_close(a, b, **tolerance, check_dtype=False)
    names = [n for n, _ in gpt.blocks[0].attn.named_parameters()]
    assert ("sinks" in names) == sinks and any(n.startswith("gate") for n in names) == bool(gate)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_a_sink_far_below_every_score_and_an_open_gate_change_nothing(scheme):
    """σ(+40) = 1 to double precision and e^(−60) is nothing beside e^score: the layer is the
    plain one, whose state dict has no gate or sinks (old checkpoints load unchanged)."""
    plain = model(scheme, SDPA())
    gated = model(scheme, SDPA(), gate="elementwise", sinks=True)
    gated.load_state_dict(plain.state_dict(), strict=False)
    with torch.no_grad():
        gated.blocks[0].attn.sinks.fill_(-60.0)
        gated.blocks[0].attn.gate.weight.zero_()
        gated.blocks[0].attn.gate.bias.fill_(40.0)
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    torch.testing.assert_close(layer_output(gated, x), layer_output(plain, x))
    assert not any("gate" in k or "sinks" in k for k in plain.state_dict())


def test_a_sink_takes_attention_the_rows_then_sum_below_one():
    gpt = model("nope", Blockwise(), sinks=True)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    q = k = x.view(1, 5, 2, 4).transpose(1, 2)
    prepared = gpt.pos.prepare(torch.arange(5))
    weights = gpt.attention.weights(
        q, k, gpt.pos, prepared, 0, 0, 5, None, gpt.blocks[0].attn.sinks
    )
    totals = weights.sum(-1)
    assert (totals < 1).all() and (totals > 0).all()
    # the first query sees one key: its weight is 1 / (1 + e^(sink − score))
    score = (q[0, :, 0] * k[0, :, 0]).sum(-1) / 2
    expected = torch.sigmoid(score - gpt.blocks[0].attn.sinks)
    torch.testing.assert_close(totals[0, :, 0].double(), expected.double())


@pytest.mark.parametrize(
    "kernel", [lambda: Flex(), lambda: LinearAttention(), lambda: StickBreaking()]
)
def test_kernels_without_a_softmax_over_keys_refuse_sinks_in_one_line(kernel):
    config = GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=8, sinks=True)
    with pytest.raises(ConfigError, match="model.sinks=true: attention=.* use attention=sdpa"):
        GPT(config, build_scheme(SCHEMES["nope"], config), kernel())


def test_the_gate_serves_every_kernel_even_linear_attention():
    config = GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=8, gate="headwise")
    for kernel in (LinearAttention(), StickBreaking(), *[make() for make in KERNELS.values()]):
        gpt = GPT(config, build_scheme(SCHEMES["nope"], config), kernel)
        logits = gpt(torch.randint(0, 17, (1, 6)))
        assert logits.shape == (1, 6, 17) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "option,message",
    [("gate", "model.gate='both'; choose null"), ("sinks", "model.sinks='yes'; choose true")],
)
def test_a_bad_option_is_one_line(option, message):
    value = {"gate": "both", "sinks": "yes"}[option]
    with pytest.raises(ConfigError, match=message):
        GPTConfig(vocab_size=17, **{option: value})


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_the_cli_trains_20_steps_with_both_and_scores_to_4x(scheme, corpus, tmp_path):
    """`train.py pos=<scheme> model.gate=headwise model.sinks=true` trains, and its evaluation
    after training scores every length to 4 × L, the rows named for the gate and the sinks."""
    import json

    from conftest import train_in_process

    extra = ["model.gate=headwise", "model.sinks=true", "trainer.max_steps=20"]
    train_in_process(scheme, corpus, tmp_path / "run", extra)
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    scored = {r["length"] for r in rows if r["status"] == "ok"}
    assert scored == {16, 32, 64}
    assert {r["scheme"] for r in rows} == {f"{scheme}, headwise gate, sinks"}
    assert all(math.isfinite(r["ppl"]) for r in rows if r["status"] == "ok")


@pytest.mark.parametrize("option", [{"gate": "headwise"}, {"sinks": True}])
def test_export_to_hugging_face_refuses_them_in_one_line(option):
    from poslab.hf.export import export_problem

    config = GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=8, **option)
    gpt = GPT(config, build_scheme(SCHEMES["rope"], config), SDPA())
    problem = export_problem(gpt, {"pos_name": "rope"})
    assert problem and "no output gate and no sink logits" in problem


def test_the_sink_column_keeps_a_shared_bias_unbatched():
    """A bias shared by the batch (1, H, T, T) stays batch 1 with the sink in front: SDPA
    broadcasts it, and CausalBias sized it (full or per block) for one sequence."""
    from poslab.model.attention import with_sink

    mask = torch.zeros(1, 4, 8, 8)
    keys = values = torch.randn(16, 4, 8, 5)
    out, keys2, values2 = with_sink(mask, keys, values, torch.zeros(4))
    assert out.shape == (1, 4, 8, 9) and keys2.shape == values2.shape == (16, 4, 9, 5)


def test_attention_statistics_of_a_model_with_sinks_count_the_sinks_share():
    """The recorded rows sum to 1 minus what the sink took: the check adds the sink's share."""
    from poslab.analysis.attention import attention_statistics

    gpt = model("alibi", SDPA(), sinks=True).float()
    stats = attention_statistics(gpt, torch.randint(0, 17, (2, 12)), train_length=6)
    assert stats.max_row_error < 1e-5 and stats.max_future_weight == 0


def test_a_schedule_with_pope_is_refused_by_linear_attention():
    config = GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=8)
    pos = {"_target_": "poslab.positions.schedule.Schedule", "layers": ["pope", "nope"]}
    with pytest.raises(ConfigError, match="attention=linear cannot serve"):
        GPT(config, build_scheme(pos, config), LinearAttention())

"""The schemes of the second interface edition (kerple, sandwich, fire, xpos, cope, randomized
positions) against their papers' formulas, and the interface's promises for every scheme of
conf/pos/: causality, relative schemes depend on m − n only, overrides change what they say."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import CONF, REPO
from hydra.utils import get_class

from poslab.attention import SDPA, Auto, Blockwise, Flex
from poslab.build import scheme_with_overrides
from poslab.errors import ConfigError
from poslab.model import GPT, GPTConfig
from poslab.positions import build_scheme, scheme_configs, scheme_names
from poslab.positions.cope import CoPE
from poslab.positions.fire import Fire
from poslab.positions.kerple import Kerple
from poslab.positions.sandwich import Sandwich
from poslab.positions.xpos import XPos

D_MODEL, N_HEAD, VOCAB = 32, 4, 41


def shift_invariant(name: str) -> bool:
    """The scheme's own word (PositionalScheme.shift_invariant): its attention depends on
    positions only through m − n (cope: on no position at all)."""
    return get_class(scheme_configs()[name]["_target_"]).shift_invariant


RELATIVE = {name for name in scheme_names() if shift_invariant(name)}
ABSOLUTE = set(scheme_names()) - RELATIVE


def model_of(name: str, seed: int = 0, **options) -> GPT:
    """A tiny GPT with large weights (so positions visibly matter) for a conf/pos/ scheme."""
    torch.manual_seed(seed)
    scheme = build_scheme(name, D_MODEL, N_HEAD, seq_len=64, n_layer=2, **options)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL), scheme,
                Auto())  # fmt: skip
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if param.dim() >= 2 and not pname.startswith("pos."):
                param.normal_(0, 0.2)
            elif pname.startswith("pos.") and not param.any():
                param.normal_(0, 1.0)  # zero-initialised tables: give them something to say
    return model.eval()


def test_the_list_of_schemes_is_conf_pos():
    assert {"kerple", "sandwich", "fire", "xpos", "cope", "rope", "alibi"} <= set(scheme_names())
    assert set(scheme_configs()) == set(scheme_names())
    assert {"nope", "rope", "alibi", "t5"} <= RELATIVE and {"learned", "sinusoidal"} <= ABSOLUTE


@pytest.mark.parametrize("name", scheme_names())
def test_causality_for_every_scheme(name):
    model = model_of(name)
    idx = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(idx)
        changed = idx.clone()
        changed[:, 11:] = (idx[:, 11:] + 1) % VOCAB
        new = model(changed)
    torch.testing.assert_close(new[:, :11], logits[:, :11], atol=1e-5, rtol=0)
    assert (new[:, 11:] - logits[:, 11:]).abs().max() > 1e-4


@pytest.mark.parametrize("name", sorted(RELATIVE))
def test_relative_schemes_depend_on_m_minus_n_only(name):
    model = model_of(name)
    idx = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        base = model(idx, torch.arange(16))
        shifted = model(idx, torch.arange(16) + 777)
    torch.testing.assert_close(shifted, base, atol=2e-4, rtol=0)


@pytest.mark.parametrize("name", sorted(ABSOLUTE))
def test_absolute_schemes_see_the_offset(name):
    model = model_of(name, **({"threshold_init": 8.0} if name == "fire" else {}))
    idx = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert not torch.allclose(model(idx, torch.arange(16)), model(idx, torch.arange(16) + 40))


@pytest.mark.parametrize("name", scheme_names())
def test_per_sequence_positions_equal_shared_ones(name):
    """(B, T) positions give each sequence what its own (T,) positions give."""
    model = model_of(name)
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    rows = torch.stack([torch.arange(12) * 2 + 3, torch.arange(12)])
    with torch.no_grad():
        both = model(idx, rows)
        for b in range(2):
            torch.testing.assert_close(both[b], model(idx[b : b + 1], rows[b])[0], atol=1e-5,
                                       rtol=0)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# each scheme against its formula


def test_kerple_log_and_power_formulas():
    for variant in ("log", "power"):
        scheme = Kerple(D_MODEL, N_HEAD, variant=variant)
        with torch.no_grad():
            scheme.r1.copy_(torch.tensor([[0.5, 1.0, 2.0, 3.0]]))
            scheme.r2.copy_(torch.tensor([[0.5, 1.0, 1.5, 5.0]]))  # 5.0: power clamps it to 2
        bias = scheme.attention_bias(torch.tensor([10]), torch.tensor([10, 7, 0]))[:, 0]
        for h, (r1, r2) in enumerate([(0.5, 0.5), (1.0, 1.0), (2.0, 1.5), (3.0, 5.0)]):
            for j, d in enumerate([0, 3, 10]):
                want = -r1 * math.log(1 + r2 * d) if variant == "log" else -r1 * d ** min(r2, 2)
                assert bias[h, j].item() == pytest.approx(want, rel=1e-6, abs=1e-6)
        # zero at distance 0, strictly falling with distance (the paper's CPD kernels)
        row = scheme.attention_bias(torch.tensor([50]), torch.arange(51))[:, 0]
        assert torch.all(row[:, -1] == 0) and torch.all(row[:, 1:] > row[:, :-1])


def test_sandwich_formula_and_shape():
    scheme = Sandwich(D_MODEL, N_HEAD, dim=8)
    bias = scheme.attention_bias(torch.tensor([5]), torch.tensor([5, 3]))[:, 0]
    for h in range(N_HEAD):
        total = sum(math.cos(2 * 10000 ** (-2 * k / 8)) for k in range(1, 5))
        assert bias[h, 1].item() == pytest.approx((total - 4) / (8 * (h + 1) / N_HEAD), rel=1e-5)
        assert bias[h, 0].item() == 0
    # never above its value at distance 0; fractional positions take the direct path
    row = scheme.attention_bias(torch.tensor([300]), torch.arange(301))
    assert row.max() <= 1e-6
    frac = scheme.attention_bias(torch.tensor([7.5]), torch.tensor([0.25, 3.0]))
    direct = scheme.score_bias(torch.arange(N_HEAD)[:, None, None], torch.tensor(7.5),
                               torch.tensor([0.25, 3.0])[None, None, :])  # fmt: skip
    torch.testing.assert_close(frac, direct)


def test_fire_input_is_normalised_and_relative_below_the_threshold():
    torch.manual_seed(0)
    scheme = Fire(D_MODEL, N_HEAD, threshold_init=100.0, c_init=0.1)
    q = torch.arange(0, 400, 7).float()[:, None]
    k = torch.arange(0, 400, 5).float()[None, :]
    x = scheme.normalized_distance(q, k, 0)
    causal = k <= q
    assert x[causal].min() >= 0 and x[causal].max() <= 1 + 1e-6
    # the formula on one pair: psi(m - n) / psi(max(L, m)), psi(x) = log(1 + c x)
    value = scheme.normalized_distance(torch.tensor(250.0), torch.tensor(40.0), 0)
    assert value.item() == pytest.approx(math.log1p(0.1 * 210) / math.log1p(0.1 * 250), rel=1e-6)
    below = scheme.attention_bias(torch.tensor([60, 90]), torch.tensor([10, 40]))
    shifted = scheme.attention_bias(torch.tensor([60, 90]) - 5, torch.tensor([10, 40]) - 5)
    torch.testing.assert_close(below, shifted)  # m ≤ L: m − n alone
    # bounded: at any length the bias stays within what f takes on [0, 1]
    far = scheme.attention_bias(torch.tensor([100_000]), torch.arange(0, 100_001, 997))
    grid = scheme.mlp(torch.linspace(0, 1, 2001), 0).t()
    assert far.min() >= grid.min() - 1e-4 and far.max() <= grid.max() + 1e-4
    # score_bias (flex's score_mod) and the chunked attention_bias agree
    heads = torch.arange(N_HEAD)[:, None, None]
    qp, kp = torch.tensor([60.0, 90.0])[None, :, None], torch.tensor([10.0, 40.0])[None, None, :]
    torch.testing.assert_close(scheme.score_bias(heads, qp, kp), below)


def test_xpos_scores_carry_zeta_to_the_distance():
    scheme = XPos(8, 1, scale_base=4.0, base=10000.0)
    zeta = (torch.arange(0, 8, 2) / 8 + 0.4) / 1.4
    torch.testing.assert_close(scheme.zeta, zeta)
    q = torch.randn(1, 1, 1, 8).expand(1, 1, 20, 8)
    k = torch.randn(1, 1, 1, 8).expand(1, 1, 20, 8)
    for offset in (0, 1000):
        rq, rk = scheme.rotate(q, k, torch.arange(20) + offset)
        scores = rq[0, 0] @ rk[0, 0].T
        if offset == 0:
            reference = scores
        torch.testing.assert_close(scores, reference, atol=1e-4, rtol=1e-4)
    # per pair the decay is exactly zeta_i^((m - n)/gamma): rotation off (a base so large that
    # every angle is ~0 is not possible, so compare with plain rotary)
    rope = XPos(8, 1, scale_base=1e12)  # decay ~1: plain rotary
    rq, rk = scheme.rotate(q, k, torch.arange(20))
    pq, pk = rope.rotate(q, k, torch.arange(20))
    m, n = 12, 4
    pair_scores = (rq[0, 0, m] * rk[0, 0, n]).view(4, 2).sum(-1)
    plain = (pq[0, 0, m] * pk[0, 0, n]).view(4, 2).sum(-1)
    torch.testing.assert_close(pair_scores, plain * zeta ** ((m - n) / 4.0), atol=1e-5, rtol=1e-4)


def test_cope_positions_and_interpolation():
    scheme = CoPE(8, 2, npos=8)
    scores = torch.randn(1, 2, 6, 6)
    future = torch.arange(6)[None, :] > torch.arange(6)[:, None]
    pos = scheme.positions_from_scores(scores, future)
    distance = (torch.arange(6)[:, None] - torch.arange(6)[None, :]).expand_as(pos)
    past, later = (~future).expand_as(pos), future.expand_as(pos)
    # non-decreasing as n moves back, within (0, m − n + 1], zero for future keys
    step_back = pos[..., :-1] - pos[..., 1:]
    assert torch.all(step_back[past[..., 1:]] >= -1e-6)
    assert torch.all(pos[past] > 0) and torch.all(pos[past] <= distance[past] + 1)
    assert torch.all(pos[later] == 0)
    # hand-computed: q·e[p] interpolated between floor and ceil
    with torch.no_grad():
        scheme.pos_emb.copy_(torch.arange(8 * 4).view(8, 4).float())
    q = torch.ones(1, 1, 1, 4)
    one = torch.tensor([[[[0.0]]]])  # sigmoid(0) = 0.5 -> p = 0.5 for the only key
    zero = torch.zeros(1)
    out = scheme.modify_scores(one, q, q, torch.zeros(1, 1, dtype=torch.bool), zero, zero)
    e0, e1 = scheme.pos_emb[0].sum(), scheme.pos_emb[1].sum()
    assert out.item() == pytest.approx(0.5 * e0.item() + 0.5 * e1.item())


def test_randomized_positions_are_sorted_distinct_and_in_range():
    scheme = build_scheme("rope", D_MODEL, N_HEAD, randomize_max=100)
    scheme.train()
    pos = scheme.positions(8, 30, torch.device("cpu"))
    assert pos.shape == (8, 30)
    assert torch.all(pos[:, 1:] > pos[:, :-1]) and pos.min() >= 0 and pos.max() < 100
    assert not torch.equal(pos[0], pos[1])  # a new draw per sequence
    scheme.eval()
    assert torch.equal(scheme.positions(8, 30, torch.device("cpu")), torch.arange(30))
    with pytest.raises(ConfigError, match="pos.randomize_max=10 is below"):
        scheme.randomize_max = 10
        scheme.max_training_position(30)
    with pytest.raises(ConfigError, match="reads no positions"):
        build_scheme("nope", D_MODEL, N_HEAD, randomize_max=100)


# ---------------------------------------------------------------------------------------------
# kernels, layers, derived state, overrides


def test_a_kernel_that_cannot_serve_a_scheme_is_one_clear_error():
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    for kernel in (SDPA(), Flex()):
        with pytest.raises(ConfigError, match="needs the scores.*use attention=auto or"):
            GPT(config, CoPE(D_MODEL, N_HEAD), kernel)
    GPT(config, CoPE(D_MODEL, N_HEAD), Blockwise())  # the kernel that serves it


def test_per_layer_parameters_reach_each_layer():
    model = model_of("t5", per_layer=True)
    assert model.pos.bias.shape[0] == 2
    q = torch.arange(10)
    assert not torch.equal(model.pos.attention_bias(q, q, 0), model.pos.attention_bias(q, q, 1))
    shared = model_of("t5")
    assert torch.equal(shared.pos.attention_bias(q, q, 0), shared.pos.attention_bias(q, q, 1))


def test_derived_state_is_not_in_checkpoints_and_old_ones_still_load():
    rope, alibi = build_scheme("rope", D_MODEL, N_HEAD), build_scheme("alibi", D_MODEL, N_HEAD)
    assert rope.state_dict() == {} and alibi.state_dict() == {}
    old = {"pos.theta": torch.ones(4), "pos.theta_init": torch.ones(4), "pos.slopes": torch.ones(4),
           "tok_emb.weight": torch.zeros(1)}  # fmt: skip
    assert rope.upgrade_state(dict(old)) == {"pos.slopes": old["pos.slopes"],
                                             "tok_emb.weight": old["tok_emb.weight"]}  # fmt: skip
    t5 = build_scheme("t5", D_MODEL, N_HEAD)
    upgraded = t5.upgrade_state({"pos.bias.weight": torch.ones(32, N_HEAD)})
    t5.load_state_dict({k.removeprefix("pos."): v for k, v in upgraded.items()})
    assert torch.equal(t5.bias[0], torch.ones(32, N_HEAD))


def test_an_override_changes_the_computation_or_is_refused():
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    rope = scheme_configs(16)["rope"]
    changed = scheme_with_overrides(rope, {"base": 500000.0}, config, 16)
    assert changed.base == 500000.0
    learnable = {**rope, "learnable_theta": True}
    weights = build_scheme("rope", D_MODEL, N_HEAD, learnable_theta=True).state_dict()
    with pytest.raises(ConfigError, match="changes nothing"):  # a learnable θ replaces the base
        scheme_with_overrides(learnable, {"base": 500000.0}, config, 16, weights)
    with pytest.raises(ConfigError, match="has no option 'bsae'"):
        scheme_with_overrides(rope, {"bsae": 5.0}, config, 16)
    # the trained value itself, said explicitly (the fp32 row of a position_dtype sweep): the
    # trained scheme, not an error
    same = scheme_with_overrides(learnable, {"position_dtype": "fp32"}, config, 16, weights)
    assert same.position_dtype == "fp32"
    learned = scheme_configs(16)["learned"]
    scheme_with_overrides(learned, {"beyond_table": "clamp"}, config, 16)  # applies past L
    with pytest.raises(ConfigError, match="changes the scheme's weights"):
        scheme_with_overrides(learned, {"max_positions": 8}, config, 16)


# ---------------------------------------------------------------------------------------------
# trained checkpoints (the session's tiny runs of every scheme, tests/conftest.py)


@pytest.mark.parametrize("name", ["kerple", "sandwich", "fire", "xpos", "cope"])
def test_every_new_scheme_trains_and_evaluates_at_16x(trained_runs, name, tmp_path):
    from omegaconf import OmegaConf

    from poslab.evaluation.run import evaluate_checkpoint

    run, metrics = trained_runs[name]
    assert metrics["best_val_loss"] < metrics["val/loss_initial"] - 0.5
    cfg = OmegaConf.load(CONF / "eval" / "default.yaml")
    cfg.merge_with({"factors": [1, 16], "max_tokens": 1500, "log_wandb": False})
    rows = evaluate_checkpoint(run / "checkpoints" / "best.ckpt", cfg, out_dir=tmp_path)
    assert [r["length"] for r in rows] == [16, 256]
    assert all(r["status"] == "ok" and math.isfinite(r["ppl"]) for r in rows)


def test_a_base_override_on_a_rope_checkpoint_changes_perplexity(trained_runs, tmp_path):
    """The silent wrong result of the first edition: the trained θ buffer came back over the
    new base. θ is now rebuilt from pos.base."""
    from omegaconf import OmegaConf

    from poslab.evaluation.run import evaluate_checkpoint

    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    cfg = OmegaConf.load(CONF / "eval" / "default.yaml")
    cfg.merge_with({"factors": [4], "max_tokens": 1500, "log_wandb": False})
    plain = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "a")[0]["ppl"]
    cfg.pos_overrides = {"base": 500000.0}
    changed = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "b")[0]["ppl"]
    assert abs(changed - plain) / plain > 1e-3


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
def test_checkpoints_of_the_first_edition_still_load(trained_runs, name, tmp_path):
    """A checkpoint as #2/#3 wrote it: derived buffers saved (θ, θ_init, slopes), T5's table as
    an nn.Embedding, the kernel as model.attention / model.attn_block_size."""
    from poslab.build import load_checkpoint

    ckpt = torch.load(trained_runs[name][0] / "checkpoints" / "best.ckpt", weights_only=True)
    state, config = ckpt["state_dict"], ckpt["hyper_parameters"]["config"]
    if name == "rope":
        state["model.pos.theta"] = state["model.pos.theta_init"] = torch.ones(16)
    elif name == "alibi":
        state["model.pos.slopes"] = torch.ones(2)
    else:
        state["model.pos.bias.weight"] = state.pop("model.pos.bias")[0]
    config.pop("attention")
    config["model"].update(attention="sdpa", attn_block_size=1024)
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    model, _ = load_checkpoint(old)
    new, _ = load_checkpoint(trained_runs[name][0] / "checkpoints" / "best.ckpt")
    idx = torch.randint(0, new.config.vocab_size, (1, 20))
    torch.testing.assert_close(model(idx), new(idx))  # old saved θ / slopes are not used


def test_the_readme_table_lists_every_scheme():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Positional schemes", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
    rows.discard("pos=")  # the header
    assert rows == set(scheme_names())


def test_overrides_of_inherited_options_and_of_zero_initialised_tables():
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    # xpos takes rope's options through **options
    assert scheme_with_overrides(scheme_configs(16)["xpos"], {"base": 5e5}, config, 16).base == 5e5
    # before training (no trained weights) a zero-initialised t5 table cannot judge an override
    t5 = scheme_with_overrides(scheme_configs(16)["t5"], {"max_distance": 64}, config, 16)
    assert t5.max_distance == 64


def test_xpos_refuses_fp16_where_its_scales_would_overflow():
    scheme = XPos(D_MODEL, N_HEAD)
    q = torch.randn(1, N_HEAD, 8192, D_MODEL // N_HEAD).half()
    with pytest.raises(ConfigError, match="beyond what fp16 holds"):
        scheme.rotate(q, q, torch.arange(8192))
    short = q[:, :, :512]
    assert torch.isfinite(scheme.rotate(short, short, torch.arange(512))[0]).all()


def test_randomized_positions_train_and_name_their_rows(corpus, tmp_path):
    """A run with pos.randomize_max trains through Lightning (per-sequence positions in every
    layer) and its evaluation rows say so, so a sweep's table tells it from the plain scheme."""
    from conftest import train_in_process

    metrics = train_in_process("alibi", corpus, tmp_path / "run", ["pos.randomize_max=64"])
    assert metrics["best_val_loss"] < metrics["val/loss_initial"] - 0.5
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    assert {r["scheme"] for r in rows} == {"alibi randomized N=64"}
    assert all(r["status"] == "ok" for r in rows)

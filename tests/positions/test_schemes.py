"""What every scheme of conf/pos/ shares: the list is the folder, randomized positions
(positions/base.py), per-layer parameters, derived state out of checkpoints, overrides that
change what they say, and the tiny trained runs of the schemes of the second interface edition
(each scheme's formula is in tests/positions/test_<scheme>.py, the interface's promises for every
scheme and kernel in tests/positions/test_properties.py)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import CONF, score_checkpoint
from models import tiny_gpt

from poslab.errors import ConfigError
from poslab.model.build import scheme_with_overrides
from poslab.model.gpt import GPTConfig
from poslab.positions import build_scheme, scheme_class, scheme_configs, scheme_names

D_MODEL, N_HEAD, VOCAB = 32, 4, 41


def test_the_list_of_schemes_is_conf_pos():
    assert {"kerple", "sandwich", "fire", "xpos", "cope", "rope", "alibi"} <= set(scheme_names())
    assert set(scheme_configs()) == set(scheme_names())
    relative = {name for name in scheme_names() if scheme_class(name).shift_invariant}
    assert {"nope", "rope", "alibi", "t5"} <= relative
    assert not relative & {"learned", "sinusoidal"}


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


def test_per_layer_parameters_reach_each_layer():
    model = tiny_gpt("t5", per_layer=True)
    assert model.pos.bias.shape[0] == 2
    q = torch.arange(10)
    assert not torch.equal(model.pos.attention_bias(q, q, 0), model.pos.attention_bias(q, q, 1))
    shared = tiny_gpt("t5")
    assert torch.equal(shared.pos.attention_bias(q, q, 0), shared.pos.attention_bias(q, q, 1))


def test_derived_state_is_not_in_checkpoints_and_old_ones_still_load():
    rope, alibi = build_scheme("rope", D_MODEL, N_HEAD), build_scheme("alibi", D_MODEL, N_HEAD)
    assert rope.state_dict() == {} and alibi.state_dict() == {}
    old = {
        "pos.theta": torch.ones(4),
        "pos.theta_init": torch.ones(4),
        "pos.slopes": torch.ones(4),
        "tok_emb.weight": torch.zeros(1),
    }
    assert rope.upgrade_state(dict(old)) == {
        "pos.slopes": old["pos.slopes"],
        "tok_emb.weight": old["tok_emb.weight"],
    }
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


NEW_SCHEMES = ["kerple", "sandwich", "fire", "xpos", "cope"]  # the second edition's
NEW_SCHEMES += ["dape", "fox", "p_rope", "hope", "resonance", "ssmax", "schedule"]  # 2024-25


@pytest.mark.parametrize("name", NEW_SCHEMES)
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


@pytest.mark.parametrize(
    "overrides",
    [
        ["attention=stick_breaking"],
        ["pos=schedule", "pos.layers=[rope,nope]", "attention.window=[8,null]"],
        ["pos=learned", "pos.combine=concat", "eval.unsupported=skip"],
    ],
    ids=["stick_breaking", "rnope_swa", "learned_concat"],
)
def test_the_new_kernels_and_options_train_and_evaluate_at_16x(corpus, overrides, tmp_path):
    """A real tiny run (Trainer, checkpoint, the evaluation after training at 1–16×) of
    stick-breaking attention, a windowed schedule and concatenated positions."""
    from conftest import train_in_process

    pos = [o.split("=", 1)[1] for o in overrides if o.startswith("pos=")]
    extra = [o for o in overrides if not o.startswith("pos=")]
    extra += ["eval.factors=[1,16]", "eval.modes=[nonoverlapping]"]
    metrics = train_in_process((pos or ["nope"])[0], corpus, tmp_path, extra)
    assert metrics["best_val_loss"] < metrics["val/loss_initial"] - 0.5
    rows = json.loads((tmp_path / "extrapolation" / "extrapolation.json").read_text())
    statuses = {r["length"]: r["status"] for r in rows}
    if "pos.combine=concat" in overrides:  # a learned table has no row past L
        assert statuses[16] == "ok" and statuses[256].startswith("skipped: learned positions")
    else:
        assert statuses == {16: "ok", 256: "ok"}
        assert all(math.isfinite(r["ppl"]) for r in rows)


def test_a_base_override_on_a_rope_checkpoint_changes_perplexity(trained_runs):
    """The silent wrong result of the first edition: the trained θ buffer came back over the
    new base. θ is now rebuilt from pos.base."""
    from omegaconf import OmegaConf

    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    cfg = OmegaConf.load(CONF / "eval" / "default.yaml")
    cfg.merge_with({"factors": [4], "max_tokens": 1500, "log_wandb": False})
    plain = score_checkpoint(ckpt, cfg)[0]["ppl"]
    cfg.pos_overrides = {"base": 500000.0}
    changed = score_checkpoint(ckpt, cfg)[0]["ppl"]
    assert abs(changed - plain) / plain > 1e-3


@pytest.mark.parametrize("name", ["rope", "alibi", "t5"])
def test_checkpoints_of_the_first_edition_still_load(trained_runs, name, tmp_path):
    """A checkpoint as #2/#3 wrote it: derived buffers saved (θ, θ_init, slopes), T5's table as
    an nn.Embedding, the kernel as model.attention / model.attn_block_size."""
    from poslab.model.build import load_checkpoint

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


def test_overrides_of_inherited_options_and_of_zero_initialised_tables():
    config = GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=N_HEAD, d_model=D_MODEL)
    # xpos takes rope's options through **options
    assert scheme_with_overrides(scheme_configs(16)["xpos"], {"base": 5e5}, config, 16).base == 5e5
    # before training (no trained weights) a zero-initialised t5 table cannot judge an override
    t5 = scheme_with_overrides(scheme_configs(16)["t5"], {"max_distance": 64}, config, 16)
    assert t5.max_distance == 64


def test_randomized_positions_train_and_name_their_rows(corpus, tmp_path):
    """A run with pos.randomize_max trains through Lightning (per-sequence positions in every
    layer) and its evaluation rows say so, so a sweep's table tells it from the plain scheme."""
    from conftest import train_in_process

    metrics = train_in_process("alibi", corpus, tmp_path / "run", ["pos.randomize_max=64"])
    assert metrics["best_val_loss"] < metrics["val/loss_initial"] - 0.5
    rows = json.loads((tmp_path / "run" / "extrapolation" / "extrapolation.json").read_text())
    assert {r["scheme"] for r in rows} == {"alibi randomized N=64"}
    assert all(r["status"] == "ok" for r in rows)

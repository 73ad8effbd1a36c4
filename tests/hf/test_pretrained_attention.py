"""eval.py hf= with the kinds that change attention itself: ReRoPE, Self-Extend, LM-Infinite
and log-n, through the attention hook (poslab/hf/pretrained_attention.py).

Tiny random Llama, Qwen2 and GPT-NeoX models (also with partial rotary) are saved and loaded
back with `from_pretrained` (tests/hf_models.py). Checked: settings that change nothing give the
model's own logits; each kind changes every layer's attention exactly as its formula says,
against a float64 reference from the model's weights (poslab/hf/tiny_hf.py: one relative distance
per query-key pair, where poslab merges two score matrices); logits inside the window are the
model's own and later ones change; Mistral keeps its sliding window; the model's own attention
(sdpa) and frequencies are back after every hooked forward; eval.py runs end to end; a model
the hook cannot serve (GPT-2: no rotary; Cohere: another pairing of rotary dims) is one line."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import contract_problems, run_in_process
from hf_models import CONTEXT, hf_model, tokenizer_for

from poslab.errors import ConfigError
from poslab.hf.pretrained import (
    PretrainedLM,
    check_hook,
    hooked_model,
    load_pretrained,
    models_per_length,
    rotary_state,
)
from poslab.hf.tiny_hf import (
    HOOK_LENGTH,
    NEUTRAL,
    ROTARY,
    TRICKS,
    W,
    recorded_attention,
    reference_attention,
)
from poslab.positions.rope_scaling import RopeScaling

CPU = torch.device("cpu")
LENGTH = HOOK_LENGTH  # tokens per probe: beyond the trained context, so LM-Infinite's cap shows


@pytest.fixture(scope="module")
def models(hf_models) -> dict[str, torch.nn.Module]:
    """arch -> the tiny model, loaded as eval.py hf= loads it."""
    return {arch: load_pretrained(str(hf_models[arch]), CPU, "32-true")[0] for arch in ROTARY}


def tokens(model, length: int = LENGTH, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (2, length), generator=generator)


def hooked(model, **options) -> PretrainedLM:
    return hooked_model(model, "tiny", RopeScaling(**options, train_length=CONTEXT))


@pytest.mark.parametrize("kind", NEUTRAL)
@pytest.mark.parametrize("arch", ROTARY)
def test_the_hook_with_settings_that_change_nothing_gives_the_models_own_logits(arch, kind, models):
    model = models[arch]
    options, length = NEUTRAL[kind]
    ids = tokens(model, length)
    with torch.inference_mode():
        own = model(input_ids=ids).logits
        got = hooked(model, **options)(ids)
    torch.testing.assert_close(got, own, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", TRICKS)
@pytest.mark.parametrize("arch", ROTARY)
def test_each_kind_changes_attention_as_its_formula_says(arch, kind, models):
    model = models[arch]
    options, _ = TRICKS[kind]
    theta = rotary_state(model, "tiny", None, CONTEXT).inv_freq[0]
    records = recorded_attention(model, hooked(model, **options), tokens(model))
    assert len(records) == model.config.num_hidden_layers
    for attention, x, got in records:
        with torch.no_grad():
            expected = reference_attention(kind, attention, theta, x)
        torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", TRICKS)
@pytest.mark.parametrize("arch", ROTARY)
def test_logits_inside_the_window_are_the_models_own_and_later_ones_change(arch, kind, models):
    model = models[arch]
    options, first = TRICKS[kind]
    ids = tokens(model)
    with torch.inference_mode():
        own = model(input_ids=ids).logits
        got = hooked(model, **options)(ids)
    torch.testing.assert_close(got[:, :first], own[:, :first], atol=2e-5, rtol=1e-5)
    moved = (got[:, first:] - own[:, first:]).abs().amax(dim=(0, 2))  # per position
    assert bool((moved > 1e-3).all()), moved


def test_the_models_own_attention_and_frequencies_are_back_after_a_hooked_forward(models):
    model = models["llama"]
    assert model.config._attn_implementation == "sdpa"  # as loaded: the plain path's kernel
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    ids = tokens(model)
    with torch.inference_mode():
        before = model(input_ids=ids).logits
        hooked(model, kind="rerope", window=W)(ids)
        after = model(input_ids=ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(model.model.rotary_emb.inv_freq, inv_freq)
    assert torch.equal(after, before)


def saved_and_loaded(config, corpus, folder) -> torch.nn.Module:
    """A tiny random model of `config`, through save_pretrained and eval.py's loader."""
    from transformers import AutoModelForCausalLM

    tokenizer = tokenizer_for(corpus)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return load_pretrained(str(folder), CPU, "32-true")[0]


def test_mistral_keeps_its_sliding_window_under_the_hook(corpus, tmp_path):
    """Mistral: Llama's attention with a sliding window (8 keys here, within a 40-token probe),
    which the hook keeps."""
    from transformers import MistralConfig

    config = MistralConfig(
        vocab_size=len(tokenizer_for(corpus)),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        sliding_window=W,
        bos_token_id=0,
        eos_token_id=1,
        initializer_range=0.2,
    )
    model = saved_and_loaded(config, corpus, tmp_path / "mistral")
    ids = tokens(model)
    with torch.inference_mode():
        own = model(input_ids=ids).logits
        got = hooked(model, kind="rerope", window=LENGTH)(ids)
        model.config.sliding_window = None  # not vacuous: the window shows in the logits
        unwindowed = model(input_ids=ids).logits
    torch.testing.assert_close(got, own, atol=2e-5, rtol=1e-5)
    assert (unwindowed - own).abs().max() > 1e-2


def cohere_config(vocab_size: int):  # -> CohereConfig
    """A tiny Cohere: rotary over interleaved pairs (dims 2i, 2i+1), where the hook rotates
    HF's rotate_half pairs."""
    from transformers import CohereConfig

    return CohereConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=CONTEXT,
        logit_scale=1.0,  # poslab's scorer takes no logit scale (refused by the first probe)
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
        initializer_range=0.2,
    )


def test_a_model_whose_attention_the_hook_does_not_reproduce_is_one_line(corpus, tmp_path):
    """Cohere rotates interleaved pairs, the hook HF's rotate_half pairs: the probe catches it
    before any scoring."""
    config = cohere_config(len(tokenizer_for(corpus)))
    model = saved_and_loaded(config, corpus, tmp_path / "cohere")
    options = {"kind": "selfextend", "logn": False}
    with pytest.raises(ConfigError) as err:
        models_per_length(model, "cohere", options, [CONTEXT], CONTEXT, CPU)
    message = str(err.value)
    assert "does not reproduce its logits" in message and "Llama" in message
    assert message.startswith("eval.rope_scaling.kind=selfextend: hf=cohere")
    assert "\n" not in message


def test_the_hooks_probe_with_bf16_weights_passes_the_models_it_serves_and_no_other(corpus):
    """With bf16 weights (a GPU under bf16-mixed) the hook and the model round differently in
    every layer: the probe's RMS criterion lets that pass and still refuses Cohere."""
    from transformers import AutoModelForCausalLM

    vocab = len(tokenizer_for(corpus))
    for arch in ROTARY:
        model = hf_model(arch, vocab).to(torch.bfloat16)
        check_hook(PretrainedLM(model, arch, None), CONTEXT, CPU, "eval.logn_scaling=true")
    torch.manual_seed(0)
    cohere = AutoModelForCausalLM.from_config(cohere_config(vocab)).eval().to(torch.bfloat16)
    with pytest.raises(ConfigError, match="does not reproduce its logits .RMS gap 0.3"):
        check_hook(PretrainedLM(cohere, "cohere", None), CONTEXT, CPU, "eval.logn_scaling=true")


def test_eval_py_with_rerope_on_a_pretrained_model_writes_the_reports(
    hf_models, corpus, tmp_path, monkeypatch, capfd
):
    out = tmp_path / "rerope"
    args = [
        f"hf={hf_models['llama']}",
        f"data_path={corpus}",
        f"eval.lengths=[{CONTEXT},{2 * CONTEXT}]",
        "eval.max_tokens=1500",
        "eval.rope_scaling.kind=rerope",
        f"out_dir={out}",
        "wandb=false",
    ]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    reports = out / "extrapolation"
    names = {p.name for p in reports.iterdir()}
    assert {"extrapolation.json", "extrapolation.csv", "extrapolation.md"} <= names
    rows = json.loads((reports / "extrapolation.json").read_text())
    assert {r["length"] for r in rows} == {CONTEXT, 2 * CONTEXT}
    assert all(r["status"] == "ok" and math.isfinite(r["ppl"]) and r["ppl"] > 1 for r in rows)
    assert rows[0]["scheme"] == "llama + rerope w=L"


def test_eval_py_with_rerope_on_gpt2_is_one_line(hf_models, corpus, tmp_path, monkeypatch, capfd):
    out = tmp_path / "gpt2"
    args = [
        f"hf={hf_models['gpt2']}",
        f"data_path={corpus}",
        "eval.rope_scaling.kind=rerope",
        f"out_dir={out}",
        "wandb=false",
    ]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    expected = "eval.rope_scaling.kind=rerope: hf="
    problems = contract_problems(result, expected, out)
    assert not problems, f"{problems}\n{result.stderr[-1500:]}"
    assert "no rotary embedding module" in result.stderr and "Llama, Mistral" in result.stderr

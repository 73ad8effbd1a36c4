"""Every scheme as a Hugging Face model with custom code (poslab/hf/bundle.py, hf/remote/): the
exported folder loads with `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)`
in a process that cannot import poslab (nor Hydra, OmegaConf or Lightning), gives poslab's
logits at 1x, 4x and 16x L, and decodes greedily as poslab's own model does, token for token;
a batch of prompts of unequal length, padded on the left, generates what each prompt does
alone."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import SCHEMES
from exported_models import SEQ_LEN, VOCAB, run_config, trained_looking, word_tokenizer

from poslab.data.tokens import EOS
from poslab.errors import ConfigError
from poslab.hf.bundle import ALLOWED
from poslab.hf.export import export_custom_code
from poslab.model.build import build_model
from poslab.positions.rope_scaling import scaling_options

LENGTHS = (SEQ_LEN, 4 * SEQ_LEN, 16 * SEQ_LEN)
PROMPT, NEW_TOKENS = 8, 6  # within L: a learned table stops at L

# (folder name, scheme, kernel, model options, eval options of the exported config): every
# scheme with the default kernel, every other kernel with a scheme it serves, the attention
# gate and sinks, and the two eval-time options
CASES: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    *((scheme, scheme, "auto", {}, {}) for scheme in SCHEMES),
    ("rope_sdpa", "rope", "sdpa", {}, {}),
    ("t5_blockwise", "t5", "blockwise", {}, {}),
    ("alibi_flex", "alibi", "flex", {}, {}),
    ("rope_linear", "rope", "linear", {}, {}),
    ("nope_stick_breaking", "nope", "stick_breaking", {}, {}),
    ("rope_gate_sinks", "rope", "auto", {"gate": "elementwise", "sinks": True}, {}),
    ("rope_yarn", "rope", "auto", {}, {"rope_scaling": {"kind": "yarn", "factor": 4}}),
    ("learned_clamp", "learned", "auto", {}, {"pos_overrides": {"beyond_table": "clamp"}}),
]

SHORTER = 3  # the padded batch's first prompt: the probe's prompt without its first 3 tokens
# runs in a fresh interpreter where poslab, Hydra, OmegaConf and Lightning cannot be imported
CHILD = (
    f"SHORTER = {SHORTER}\n"
    + r"""
import sys
for name in ("poslab", "hydra", "omegaconf", "lightning", "pytorch_lightning"):
    sys.modules[name] = None
import torch
from pathlib import Path
from transformers import AutoModelForCausalLM

results = {}
for folder in map(Path, sys.argv[2:]):
    probe = torch.load(folder / "probe.pt")
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    logits = []
    for ids in probe["ids"]:
        try:
            with torch.no_grad():
                logits.append(model(input_ids=ids).logits)
        except Exception as err:
            logits.append(f"{type(err).__name__}: {err}")
    greedy = {"do_sample": False, "max_new_tokens": probe["new"]}
    prompt, short = probe["prompt"], probe["prompt"][:, SHORTER:]
    padded = torch.cat([torch.cat([torch.zeros_like(prompt[:, :SHORTER]), short], 1), prompt])
    mask = torch.ones_like(padded)
    mask[0, :SHORTER] = 0
    results[folder.name] = {
        "logits": logits,
        "generated": model.generate(prompt, use_cache=False, **greedy),
        "cached": model.generate(prompt, use_cache=True, **greedy),
        "cache_problem": model.cache_problem,
        "short": model.generate(short, use_cache=True, **greedy),
        "batch": model.generate(padded, attention_mask=mask, pad_token_id=0, **greedy),
    }
torch.save(results, sys.argv[1])
"""
)


def with_eval_options(config: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The run config as eval.py builds it with eval.pos_overrides and eval.rope_scaling."""
    pos = {**config["pos"], **options.get("pos_overrides", {})}
    if "rope_scaling" in options:
        pos["scaling"] = scaling_options(options["rope_scaling"], pos, SEQ_LEN, SEQ_LEN)
    return {**config, "pos": pos}


def logits_or_error(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor | str:
    try:
        with torch.no_grad():
            return model(ids)
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def greedy(model: torch.nn.Module, prompt: torch.Tensor, new: int, eos: int) -> torch.Tensor:
    """poslab's own greedy decoding, stopping after <eos> as generate does."""
    ids = prompt
    with torch.no_grad():
        for _ in range(new):
            token = model(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
            if int(token) == eos:
                break
    return ids


def export_cases(root: Path, cases: list[tuple]) -> dict[str, Any]:
    """Each case exported into root/NAME with its probe inputs; poslab's results on them."""
    tokenizer = word_tokenizer()
    ours: dict[str, Any] = {}
    for name, scheme, kernel, model_options, eval_options in cases:
        config = run_config(scheme, kernel, model_options)
        model = trained_looking(config)
        export_custom_code(model, config, tokenizer, root / name)
        if eval_options:
            (root / name / "config.json").write_text(
                json.dumps(
                    {**json.loads((root / name / "config.json").read_text()), "eval": eval_options}
                )
            )
            evaluated = build_model(with_eval_options(config, eval_options), VOCAB)
            evaluated.load_state_dict(model.state_dict())
            model = evaluated.eval()
        generator = torch.Generator().manual_seed(1)
        ids = [torch.randint(0, VOCAB, (2, n), generator=generator) for n in LENGTHS]
        prompt = torch.randint(2, VOCAB, (1, PROMPT), generator=generator)
        torch.save({"ids": ids, "prompt": prompt, "new": NEW_TOKENS}, root / name / "probe.pt")
        ours[name] = {
            "logits": [logits_or_error(model, x) for x in ids],
            "generated": greedy(model, prompt, NEW_TOKENS, eos=tokenizer.token_to_id(EOS)),
            "cache_problem": model.cache_problem(),
        }
    return ours


def check_logits(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    for length, mine, its in zip(LENGTHS, ours["logits"], theirs["logits"], strict=True):
        if isinstance(mine, str):  # a length poslab refuses (a learned table): refused alike
            assert its == mine, f"at {length}"
        else:
            assert isinstance(its, torch.Tensor), f"at {length}: {its}"
            assert (its - mine).abs().max() <= 1e-5, f"at {length}"


# a few cases in this process (fast): the folder's own modules, loaded by HF's loader
FAST_CASES = [c for c in CASES if c[0] in ("alibi", "cope", "fox", "rope_yarn", "learned_clamp")]


@pytest.mark.parametrize("case", FAST_CASES, ids=[c[0] for c in FAST_CASES])
def test_an_exported_model_loads_with_trust_remote_code_and_gives_poslabs_logits(
    case, tmp_path, monkeypatch
):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    name = case[0]
    ours = export_cases(tmp_path, [case])[name]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / name, trust_remote_code=True).eval()
    assert type(model).__module__.endswith("modeling_poslab")
    assert not type(model.poslab).__module__.startswith("poslab.")  # the folder's, not ours
    probe = torch.load(tmp_path / name / "probe.pt")
    theirs = {
        "logits": [logits_or_error(lambda x: model(input_ids=x).logits, x) for x in probe["ids"]]
    }
    check_logits(ours, theirs)
    for use_cache in (False, True):
        generated = model.generate(
            probe["prompt"], do_sample=False, max_new_tokens=probe["new"], use_cache=use_cache
        )
        assert generated.tolist() == ours["generated"].tolist()
        check_left_padded_batch(model, probe, use_cache)


def check_left_padded_batch(model: Any, probe: dict[str, Any], use_cache: bool) -> None:
    """Two prompts of unequal length in one batch, the shorter padded on the left (the
    attention mask's zeros): each generates what it generates alone; padding on the right is
    refused in one line."""
    prompt = probe["prompt"]
    short = prompt[:, SHORTER:]
    padded = torch.cat([torch.cat([torch.zeros_like(prompt[:, :SHORTER]), short], 1), prompt])
    mask = torch.ones_like(padded)
    mask[0, :SHORTER] = 0
    greedy = {"do_sample": False, "max_new_tokens": probe["new"], "use_cache": use_cache}
    batch = model.generate(padded, attention_mask=mask, pad_token_id=0, **greedy)
    check_batch(batch, [model.generate(p, **greedy) for p in (short, prompt)])
    with pytest.raises(ValueError, match="padding on the left only"):
        model(input_ids=padded, attention_mask=mask.flip(1))


def check_batch(batch: torch.Tensor, alone: list[torch.Tensor]) -> None:
    """Each row of a left-padded batch's generation (the first padded by SHORTER) is its
    prompt's alone, then padding (0) where it ended earlier, at <eos>."""
    for row, lead, single in zip(batch.tolist(), (SHORTER, 0), alone, strict=True):
        single = single[0].tolist()
        assert row[lead : lead + len(single)] == single
        assert set(row[lead + len(single) :]) <= {0}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every case exported and loaded back in one poslab-free process: (poslab's, theirs)."""
    root = tmp_path_factory.mktemp("exported")
    ours = export_cases(root, CASES)
    out = root / "theirs.pt"
    env = {"HF_MODULES_CACHE": str(root / "modules"), "HF_HUB_OFFLINE": "1", "PATH": ""}
    folders = [str(root / name) for name, *_ in CASES]
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), *folders],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return ours, torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", [case[0] for case in CASES])
def test_without_poslab_the_exported_model_gives_poslabs_logits_at_1_4_and_16x_L(name, exported):
    ours, theirs = exported
    check_logits(ours[name], theirs[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", [case[0] for case in CASES])
def test_without_poslab_greedy_generation_equals_poslabs_greedy_decoding(name, exported):
    """With the cache and without it, token for token; the cache where poslab's model keeps
    one (GPT.cache_problem), and the same reason where it does not."""
    ours, theirs = exported
    assert theirs[name]["generated"].tolist() == ours[name]["generated"].tolist()
    assert theirs[name]["cached"].tolist() == ours[name]["generated"].tolist()
    assert theirs[name]["cache_problem"] == ours[name]["cache_problem"]
    check_batch(theirs[name]["batch"], [theirs[name]["short"], theirs[name]["cached"]])


def test_the_folder_imports_nothing_beyond_its_requirements(tmp_path):
    """Every module of an exported folder imports the standard library, torch, transformers
    (numpy comes with it) or the folder's own files, outside functions; what a function
    imports beyond those (a plot's matplotlib) is imported by importlib, which the loader does
    not demand."""
    config = run_config("rope", "auto", {})
    export_custom_code(trained_looking(config), config, word_tokenizer(), tmp_path)
    files = sorted(tmp_path.glob("*.py"))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                tops = {node.module.split(".")[0]}
            elif isinstance(node, ast.ImportFrom):  # relative: a file of the folder
                assert (tmp_path / f"{node.module}.py").is_file(), (path.name, node.module)
                continue
            else:
                continue
            assert tops <= ALLOWED, (path.name, tops - ALLOWED)
    requirements = (tmp_path / "requirements.txt").read_text().split()
    assert {r.split(">")[0] for r in requirements} >= {"torch", "transformers"}


def test_eval_options_the_exported_model_cannot_take_are_refused_when_loading(tmp_path):
    from transformers import AutoModelForCausalLM

    config = run_config("rope", "auto", {})
    export_custom_code(trained_looking(config), config, word_tokenizer(), tmp_path / "m")
    cases = {
        "eval.rope_scaling.factor='auto'": {"rope_scaling": {"kind": "yarn", "factor": "auto"}},
        "eval.window": {"window": 4},
    }
    for expected, options in cases.items():
        with pytest.raises(ValueError, match=expected.split("=")[0].replace(".", r"\.")):
            AutoModelForCausalLM.from_pretrained(
                tmp_path / "m", trust_remote_code=True, eval=options
            )


def test_a_bpe_run_exports_its_tokenizer_with_poslabs_ids(corpus, tmp_path, monkeypatch):
    """A byte-level BPE tokenizer (data.tokenizer=bpe) goes with the model as a
    PreTrainedTokenizerFast that reads the corpus's text into poslab's own ids, and the model
    generates from them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from poslab.data.cache import TokenCache

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    cache = TokenCache(
        "toy", path=str(corpus), tokenizer="bpe", vocab_size=300, cache_dir=str(tmp_path / "cache")
    )
    cache.build()
    tokenizer = cache.tokenizer()
    config = run_config("kerple", "auto", {})
    torch.manual_seed(0)
    from poslab.model.build import build_model

    model = build_model(config, tokenizer.get_vocab_size()).eval()
    export_custom_code(model, config, tokenizer, tmp_path / "m")
    theirs = AutoTokenizer.from_pretrained(tmp_path / "m")
    line = " the a1 n3 v3 the n7 . "
    ids = theirs(line, add_special_tokens=False)["input_ids"]
    assert ids == tokenizer.encode(line).ids and len(ids) > 3
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "m", trust_remote_code=True).eval()
    prompt = torch.tensor([ids])
    with torch.no_grad():
        assert (loaded(input_ids=prompt).logits - model(prompt)).abs().max() <= 1e-5
    text = theirs.decode(loaded.generate(prompt, do_sample=False, max_new_tokens=4)[0])
    assert text.startswith(theirs.decode(ids))


def test_an_export_with_broken_model_code_is_told_so(tmp_path):
    """#60: an export whose modeling file was broken was reported as "could not load its
    weights"; the line names the code file."""
    from poslab.hf.pretrained import load_pretrained

    config = run_config("alibi", "auto", {})
    folder = tmp_path / "broken_export"
    export_custom_code(trained_looking(config), config, word_tokenizer(), folder)
    (code,) = [p for p in folder.glob("modeling_*.py")]
    code.write_text(code.read_text() + "\nraise RuntimeError('edited by hand')\n")
    with pytest.raises(ConfigError) as refused:
        load_pretrained(str(folder), torch.device("cpu"), "32-true", trust_remote_code=True)
    assert f"its model code {code.name} failed to run" in str(refused.value)
    assert "weights" not in str(refused.value)

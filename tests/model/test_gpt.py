"""poslab/model/gpt.py: the GPT's plumbing (tied head, position shapes, the loss), and the rule
that no generic module branches on a scheme's name."""

from __future__ import annotations

import importlib.util
import io
import pkgutil
import re
import tokenize
from pathlib import Path

import pytest
import torch
from models import D_MODEL, VOCAB, tiny_gpt, tokens
from torch import nn

from poslab.errors import ConfigError
from poslab.model.gpt import GPTConfig
from poslab.positions import scheme_names


def test_lm_head_tied_to_token_embedding():
    model = tiny_gpt("nope")
    assert model.lm_head.weight is model.tok_emb.weight
    with torch.no_grad():
        model.tok_emb.weight[3].fill_(0.5)
    assert torch.equal(model.lm_head.weight[3], torch.full((D_MODEL,), 0.5))
    # counted once among the parameters
    n_unique = sum(p.numel() for p in model.parameters())
    n_named = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert n_named - n_unique == VOCAB * D_MODEL


@pytest.mark.parametrize(
    "positions",
    [torch.arange(8)[None], torch.arange(7), torch.arange(9), torch.tensor(3)],
    ids=["2d", "short", "long", "scalar"],
)
def test_positions_of_wrong_shape_raise(positions):
    model = tiny_gpt("rope", pairing="half")
    with pytest.raises(ConfigError, match="positions"):
        model(tokens(2, 8), positions=positions)


def test_gpt_config_rejects_indivisible_heads():
    with pytest.raises(ConfigError, match=r"model\.d_model"):
        GPTConfig(vocab_size=VOCAB, d_model=30, n_head=4)
    GPTConfig(vocab_size=VOCAB, d_model=32, n_head=4)  # divisible is fine


def test_training_loss_equals_cross_entropy_of_the_logits():
    model = tiny_gpt("t5")
    idx, targets = tokens(2, 12), tokens(2, 12, seed=5)
    logits = model(idx)
    ref = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.testing.assert_close(model.loss(idx, targets), ref, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# No generic module branches on scheme names
# --------------------------------------------------------------------------------------------

# every scheme of conf/pos/, and the class-name spellings of some
FORBIDDEN = (*scheme_names(), "rotary")
_SKIP = {tokenize.NL, tokenize.COMMENT}
_STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
_TEXT_TYPES = {tokenize.NAME, tokenize.STRING}
if hasattr(tokenize, "FSTRING_MIDDLE"):  # Python >= 3.12 splits f-strings into parts
    _TEXT_TYPES.add(tokenize.FSTRING_MIDDLE)


def _contains_word(text: str, word: str) -> bool:
    """Case-insensitive `word` in `text` at word boundaries (non-letters, `_`, or camelCase),
    so `use_rope`, `ropeTheta`, `T5Bias`, `"alibi"` match but `property` does not."""
    for match in re.finditer(re.escape(word), text, flags=re.IGNORECASE):
        i, j = match.start(), match.end()
        left = i == 0 or not text[i - 1].isalpha() or (text[i - 1].islower() and text[i].isupper())
        right = j == len(text) or not text[j].islower()
        if left and right:
            return True
    return False


def _is_prose(text: str) -> bool:
    """A string of words (a message, a help text): "learned from the train split" names no
    scheme; a key compared with a scheme's name has no space in it."""
    body = re.sub(r"\{[^{}]*\}", "", text)  # an f-string's replacement fields
    return len(re.sub(r"^[a-zA-Z]*['\"]+|['\"]+$", "", body).split()) > 1


# result fields and options that hold a scheme's name as an English word: whether a task run
# learned its task at L (`eval.learned_at`, the rows' `learned`, `learned_seeds`). Only these
# exact string literals pass; a NAME `learned` (cfg.learned) is still flagged, but a generic
# module comparing a scheme to the bare string "learned" would pass unseen.
NOT_SCHEME_STRINGS = {"learned", "learned_at", "learned_seeds", "steps_learned", "eval.learned_at"}


def _scheme_names_in_code(source: str) -> list[str]:
    """Scheme names in NAME and STRING tokens, ignoring comments, docstrings, prose and the module
    paths of `import` / `from … import` statements (importing poslab.positions.rope_scaling
    branches on nothing)."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)]
    significant = [t for t in tokens if t.type not in _SKIP]
    hits = []
    in_import = False
    for n, tok in enumerate(significant):
        prev_type = significant[n - 1].type if n else tokenize.NEWLINE
        if tok.type == tokenize.NEWLINE:
            in_import = False
        elif tok.type == tokenize.NAME and tok.string in ("import", "from"):
            in_import = in_import or prev_type in _STATEMENT_START
        if in_import or tok.type not in _TEXT_TYPES:
            continue
        if tok.type == tokenize.STRING:
            next_type = significant[n + 1].type if n + 1 < len(significant) else tokenize.NEWLINE
            is_docstring = prev_type in _STATEMENT_START and next_type in (
                tokenize.NEWLINE,
                tokenize.ENDMARKER,
            )
            if is_docstring:
                continue
        if tok.type != tokenize.NAME and _is_prose(tok.string):
            continue
        if tok.type == tokenize.STRING and tok.string.strip("\"'") in NOT_SCHEME_STRINGS:
            continue
        hits += [f"{tok.start[0]}:{tok.string}" for w in FORBIDDEN if _contains_word(tok.string, w)]
    return hits


def test_scheme_name_detector_controls():
    flagged = [
        'if name == "rope":\n    pass\n',
        "x = T5Bias(1, 2)\n",
        "use_alibi = True\n",
        "emb = RotaryEmbedding()\n",
        "kind = f'{prefix}sinusoidal'\n",
        "x = cfg.learned\n",
        "y = isALiBi\n",
        # an import is not a branch, but what follows it on the next line still is
        "from poslab.positions import rope_scaling\nif name == 'rope':\n    pass\n",
        "x = 1\nraise ValueError('no') from alibi_error\n",
        "kind = f'{prefix} {x}sinusoidal'\n",
    ]
    for src in flagged:
        assert _scheme_names_in_code(src), src
    clean = [
        '"""Module docstring: rope, alibi, t5, sinusoidal, learned."""\nx = 1\n',
        "def f():\n    '''RoPE and ALiBi are fine here.'''\n    return 1  # t5, alibi\n",
        "class A:\n    @property\n    def prop(self):\n        return self.pos.rotate\n",
        "import poslab.positions.rope_scaling\n",
        "raise ConfigError(f'none of its words is in the vocabulary{x} learned from the data')\n",
        "from poslab.positions.rope_scaling import eval_overrides\n",
        "from poslab.positions import (\n    alibi,\n    rope,\n)\n",
        "if TYPE_CHECKING:\n    from poslab.positions.t5 import T5Bias\n",
    ]
    for src in clean:
        assert not _scheme_names_in_code(src), src


def _generic_modules() -> list[str]:
    """Every module of poslab outside the schemes (poslab.positions), the analysis tools
    (poslab.analysis: plots of named schemes' formulas) and the configs."""
    import poslab

    # the benchmark names schemes on purpose: its targets are against nope, its peers by name;
    # LongRoPE's factor search is a command about one rotary kind's factors, not model code
    skipped = ("poslab.positions", "poslab.analysis", "poslab.conf", "poslab.bench")
    skipped += ("poslab.evaluation.longrope_search",)
    names = [m.name for m in pkgutil.walk_packages(poslab.__path__, "poslab.")]
    return sorted(n for n in ["poslab", *names] if not n.startswith(skipped))


# left out on purpose: their branches on scheme names are what they are for
NAMED_ON_PURPOSE = {
    # the shape checks test the papers' claims about named schemes (ALiBi flat past L, rotary
    # rising)
    "poslab.report.compare",
    # the family of each scheme (a table of names) that a figure of many rows is drawn by
    "poslab.report.families",
    # the schemes that map to an HF architecture (learned -> GPT-2, rope -> GPT-NeoX)
    "poslab.hf.export",
    # an HF model's rotary module, where eval-time frequency kinds reach it
    "poslab.hf.pretrained",
    # the attention hook that gives HF rotary models the eval-time kinds that change attention
    # (rerope, selfextend, lminfinite, log-n)
    "poslab.hf.pretrained_attention",
    # tiny HF models with HF's own rope_parameters of each kind, and float64 references of the
    # kinds' formulas: parity tests and scripts/pretrained_parity.py
    "poslab.hf.tiny_hf",
}
GENERIC_MODULES = [m for m in _generic_modules() if m not in NAMED_ON_PURPOSE]


def test_the_generic_modules_are_the_package():
    assert {
        "poslab.model.gpt",
        "poslab.model.attention",
        "poslab.evaluation.plan",
        "poslab.data.cache",
        "poslab.run.run_folder",
        "poslab.tasks.base",
    } <= set(GENERIC_MODULES)
    assert set(_generic_modules()) >= NAMED_ON_PURPOSE


@pytest.mark.parametrize("module", GENERIC_MODULES)
def test_model_never_branches_on_scheme_names(module):
    source = Path(importlib.util.find_spec(module).origin).read_text()
    assert _scheme_names_in_code(source) == []

"""scripts/generate.py (poslab/apps/generate.py): text from a run's checkpoint with poslab's own
model: greedy decoding is the argmax at every step, sampling follows its seed (top_k=1 is
greedy), eval-time options apply, and every bad input is one line."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import TINY, compose_train

from poslab.apps.generate import main
from poslab.data.tokens import EOS, UNK
from poslab.evaluation.run import checkpoint_of_run
from poslab.hf.export import run_tokenizer
from poslab.model.build import load_checkpoint

PROMPT = " the a1 n3 v3 the"


def generated(capsys, *args: str) -> str:
    capsys.readouterr()
    main(list(args))
    return capsys.readouterr().out.strip()


def test_greedy_generation_is_the_argmax_at_every_step(trained_runs, capsys):
    run = trained_runs["rope"][0]
    out = generated(capsys, f"run={run}", f"prompt={PROMPT}", "max_new_tokens=8")
    ckpt = checkpoint_of_run(run)
    model, config = load_checkpoint(ckpt)
    tokenizer = run_tokenizer(ckpt, config)
    ids = torch.tensor([tokenizer.encode(PROMPT).ids])
    eos = tokenizer.token_to_id(EOS)
    with torch.no_grad():
        for _ in range(8):
            token = model(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, token], dim=1)
            if int(token) == eos:
                break
    new = tokenizer.decode(ids[0, len(tokenizer.encode(PROMPT).ids) :].tolist())
    assert out == f"{PROMPT.strip()} {new.strip()}"
    assert len(out.split()) > len(PROMPT.split())  # it added words


def test_sampling_follows_its_seed_and_top_k_1_is_greedy(trained_runs, capsys):
    run = trained_runs["alibi"][0]
    base = [f"run={run}", f"prompt={PROMPT}", "max_new_tokens=12"]
    greedy = generated(capsys, *base)
    sampled = [generated(capsys, *base, "temperature=1.5", f"seed={s}") for s in (1, 1, 2)]
    assert sampled[0] == sampled[1]
    assert len(set(sampled) | {greedy}) >= 2  # sampling at 1.5 strays from greedy somewhere
    assert generated(capsys, *base, "temperature=1.5", "top_k=1", "seed=5") == greedy


def test_an_eval_time_rope_extension_applies(trained_runs, capsys):
    run = trained_runs["rope"][0]
    base = [f"run={run}", f"prompt={PROMPT}", "max_new_tokens=8"]
    scaled = [*base, "eval.rope_scaling.kind=pi", "eval.rope_scaling.factor=8"]
    assert generated(capsys, *scaled) != generated(capsys, *base)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["prompt=x"], "pass exactly one of run=RUN_DIR or ckpt=PATH"),
        (["run={run}"], 'pass prompt="..."'),
        (["run={run}", "prompt=x", "temprature=1"], "temprature=: no such option"),
        (["run={run}", "prompt=x", "temperature=-1"], "temperature=-1 must be a finite number"),
        (["run={run}", "prompt=x", "max_new_tokens=0"], "max_new_tokens=0 must be an integer"),
        (["run={run}", "prompt"], "arguments are key=value"),
        (["run={task}", "prompt=the cat"], "trained on a generated task: its prompt is token ids"),
        (["run={run}", "prompt=x", "eval.rope_scaling.kind=yarm"], "eval.rope_scaling.kind='yarm'"),
        # issue #60: before any loading
        (["run={run}", "prompt=x", "temperature=.nan"], "temperature=nan must be a finite number"),
        (["run={run}", "prompt=x", "temperature=.inf"], "temperature=inf must be a finite number"),
        (["run={run}", "prompt=x", "top_k=5"], "top_k=5 does nothing at temperature=0"),
        (
            ["run={run}", "prompt=x", "eval.rope_scaling.kind=pi"],
            "eval.rope_scaling.kind=pi needs a number for eval.rope_scaling.factor",
        ),
        (
            [
                "run={run}",
                "prompt=x",
                "eval.rope_scaling.kind=yarn",
                "eval.rope_scaling.factor=auto",
            ],
            "eval.rope_scaling.kind=yarn needs a number",
        ),
        (["run={run}", "prompt=x", "device=gpu"], "device='gpu' is not a device"),
    ],
    ids=[
        *("no-run", "no-prompt", "typo", "temperature", "new-tokens", "no-equals", "task", "kind"),
        *("nan", "inf", "top-k-greedy", "pi-auto", "yarn-auto", "no-such-device"),
    ],
)
def test_bad_input_is_one_line(args, expected, trained_runs, task_run, capsys):
    args = [a.format(run=trained_runs["rope"][0], task=task_run) for a in args]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


def one_error_line(capsys, *args: str) -> str:
    """The one `error:` line of a refused command (exit 2, nothing on stdout)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and not out, (out, lines)
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without CUDA")
def test_device_cuda_without_cuda_is_one_line(trained_runs, capsys):
    line = one_error_line(capsys, f"run={trained_runs['rope'][0]}", "prompt=the", "device=cuda")
    assert "no CUDA device is visible; use device=cpu" in line


def test_a_learned_table_too_short_is_refused_before_generating_with_advice_that_works(
    trained_runs, capsys
):
    """16 rows (L = 16): a 5-token prompt and 20 new tokens reach position 23. Refused before
    a token is made, with advice in generate's own form, which then generates."""
    run = trained_runs["learned"][0]
    args = [f"run={run}", "prompt=the a1 n3 v3 the", "max_new_tokens=20"]
    line = one_error_line(capsys, *args)
    assert "beyond the table of 16 rows" in line and "max_new_tokens=20" in line, line
    assert "eval.pos_overrides.beyond_table=clamp" in line and "+eval" not in line, line
    assert generated(capsys, *args, "eval.pos_overrides.beyond_table=clamp")
    assert generated(capsys, *args, "+eval.pos_overrides.beyond_table=clamp")  # eval.py's form
    # the last token made is never fed: 5 + 12 - 2 = 15, the table's last row
    assert generated(capsys, f"run={run}", "prompt=the a1 n3 v3 the", "max_new_tokens=12")


def test_it_says_why_it_stopped(trained_runs, capsys):
    run = trained_runs["rope"][0]
    capsys.readouterr()
    main([f"run={run}", f"prompt={PROMPT}", "max_new_tokens=3"])
    out, err = capsys.readouterr()
    assert err.strip().splitlines()[-1] == "note: stopped at max_new_tokens=3"
    assert len(out.split()) == len(PROMPT.split()) + 3
    ckpt = checkpoint_of_run(run)
    eos = run_tokenizer(ckpt, load_checkpoint(ckpt)[1]).token_to_id(EOS)
    # sampled hot until a text ends (the toy corpus has short lines)
    main([f"run={run}", f"prompt={PROMPT}", "max_new_tokens=200", "temperature=1"])
    out, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]
    assert last.startswith("note: stopped at the end of a text (<eos>) after "), last
    count = int(last.split("after ")[1].split()[0])
    assert len(out.split()) == len(PROMPT.split()) + count - 1  # every token but <eos> shown
    assert eos is not None


def test_unk_is_printed_and_unknown_prompt_words_are_named(trained_runs, capsys):
    """<unk> is shown, not dropped (a plain decode skips special tokens), and the prompt words
    the vocabulary lacks are named."""
    from poslab.apps.generate import decoded

    run = trained_runs["rope"][0]
    ckpt = checkpoint_of_run(run)
    tokenizer = run_tokenizer(ckpt, load_checkpoint(ckpt)[1])
    unk, eos, the = (tokenizer.token_to_id(t) for t in (UNK, EOS, "the"))
    assert decoded(tokenizer, [the, unk, the, unk, eos], eos).split() == [
        "the",
        UNK,
        "the",
        UNK,
    ]
    capsys.readouterr()
    main([f"run={run}", "prompt=the zebra a1 okapi", "max_new_tokens=2"])
    out, err = capsys.readouterr()
    assert out.startswith("the zebra a1 okapi ")
    assert (
        "note: 2 prompt word(s) not in the run's vocabulary became <unk>: 'zebra', 'okapi'" in err
    )


@pytest.fixture(scope="module")
def version_1_run(corpus, tmp_path_factory) -> object:
    """A word-vocabulary run with data.tokenizer_version=1 on a text holding <unk>: its <eos>
    shares an id with "the" (data/tokens.py)."""
    from poslab.run.training import run_training

    root = tmp_path_factory.mktemp("v1")
    text = root / "corpus"
    shutil.copytree(corpus, text)
    for split in ("train", "valid", "test"):
        path = text / f"{split}.txt"
        path.write_text(path.read_text().replace(" . ", " <unk> . ", 50))
    tiny = [o for o in TINY if not o.startswith(("trainer.max_steps", "eval."))]
    overrides = ["pos=rope", f"data.path={text}", *tiny, "trainer.max_steps=4"]
    overrides += ["data.tokenizer_version=1", "eval.factors=[1]", "eval.modes=[nonoverlapping]"]
    run_training(compose_train(overrides, root / "run"))
    return root / "run"


def test_a_version_1_run_is_refused_in_one_line(version_1_run, capsys):
    line = one_error_line(capsys, f"run={version_1_run}", "prompt=the cat", "max_new_tokens=4")
    assert "version 1 (data.tokenizer_version)" in line, line
    assert "data.tokenizer_version=2" in line and "generation" in line, line


def test_why_there_is_no_key_value_cache_is_shown(trained_runs, capsys):
    """dynamic_ntk reads the forward's length, so cached keys would go stale: generation
    recomputes, and says why on stderr (it was logged where no handler showed it)."""
    run = trained_runs["rope"][0]
    capsys.readouterr()
    main(
        [f"run={run}", f"prompt={PROMPT}", "max_new_tokens=2", "eval.rope_scaling.kind=dynamic_ntk"]
    )
    err = capsys.readouterr().err
    assert "note: no key/value cache: pos=Rotary treats a token by the forward's length" in err


def test_a_long_generation_says_how_far_it_is(capsys):
    """The progress line (every 5 s in generate.py's main; here at every token): new tokens so
    far of those asked, and the rate; none after the last token."""
    from models import tiny_gpt, tokens

    from poslab.apps.generate import Progress, generate

    model = tiny_gpt("rope")
    capsys.readouterr()
    args = (tokens(1, 4), 6, 0.0, None, None, torch.Generator(), model.new_cache())
    generate(model, *args, progress=Progress(6, every=0.0))
    lines = capsys.readouterr().err.strip().splitlines()
    expected = [f"note: {n}/6 new tokens" for n in range(1, 6)]
    assert [line.split(",")[0] for line in lines] == expected
    assert all(line.endswith("tokens/s") for line in lines)
    generate(model, *args[:-1], model.new_cache(), progress=Progress(6))  # 5 s: says nothing
    assert capsys.readouterr().err == ""

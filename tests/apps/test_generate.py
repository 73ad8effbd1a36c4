"""scripts/generate.py (poslab/apps/generate.py): text from a run's checkpoint with poslab's own
model: greedy decoding is the argmax at every step, sampling follows its seed (top_k=1 is
greedy), eval-time options apply, and every bad input is one line."""

from __future__ import annotations

import pytest
import torch

from poslab.apps.generate import main
from poslab.data.tokens import EOS
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
        (["run={run}", "prompt=x", "temperature=-1"], "temperature=-1 must be a number"),
        (["run={run}", "prompt=x", "max_new_tokens=0"], "max_new_tokens=0 must be an integer"),
        (["run={run}", "prompt"], "arguments are key=value"),
        (["run={task}", "prompt=the cat"], "trained on a generated task: its prompt is token ids"),
        (["run={run}", "prompt=x", "eval.rope_scaling.kind=yarm"], "eval.rope_scaling.kind='yarm'"),
    ],
    ids=["no-run", "no-prompt", "typo", "temperature", "new-tokens", "no-equals", "task", "kind"],
)
def test_bad_input_is_one_line(args, expected, trained_runs, task_run, capsys):
    args = [a.format(run=trained_runs["rope"][0], task=task_run) for a in args]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]

"""evaluation/run.py: evaluate_checkpoint on the tiny trained runs: its files, the position
offset, a table's end, strides, bf16 against fp32, eval.max_tokens; eval.py's table."""

from __future__ import annotations

import json
import re

import pytest
from conftest import SCHEMES, eval_cfg, run_in_process, score_checkpoint

import poslab.evaluation.recorded
import poslab.evaluation.run
from poslab.errors import ConfigError
from poslab.evaluation.run import evaluate_checkpoint, scored_token_cap
from poslab.positions import scheme_class


def test_evaluate_checkpoint_writes_every_output(trained_runs, tmp_path):
    run, _ = trained_runs["alibi"]
    cfg = eval_cfg(factors=[1, 2, 16], modes=["nonoverlapping", "sliding"])
    rows = evaluate_checkpoint(run / "checkpoints" / "best.ckpt", cfg, out_dir=tmp_path)
    out = tmp_path / "extrapolation"
    for name in (
        "extrapolation.json",
        "extrapolation.csv",
        "extrapolation.md",
        "extrapolation_ppl.png",
        "extrapolation_loss_by_position.png",
    ):
        assert (out / name).stat().st_size > 0, name
    assert (out / "extrapolation_ppl.png").read_bytes()[:4] == b"\x89PNG"
    # the out_dir names the run it evaluated: compare.py reads that run's seed from it
    record = json.loads((tmp_path / "evaluated_run.json").read_text())
    assert record["run"] == str(run.resolve())
    saved = json.loads((out / "extrapolation.json").read_text())
    assert [(r["mode"], r["length"]) for r in saved] == [
        ("nonoverlapping", 16),
        ("nonoverlapping", 32),
        ("nonoverlapping", 256),
        ("sliding", 16),
        ("sliding", 32),
        ("sliding", 256),
    ]
    assert all(r["status"] == "ok" and r["ppl"] > 1 for r in rows)
    assert saved[0]["word_ppl"] == pytest.approx(saved[0]["ppl"], rel=1e-6)  # word tokenizer
    assert "| nonoverlapping |" in (out / "extrapolation.md").read_text()
    header = (out / "extrapolation.csv").read_text().splitlines()[0]
    assert header.startswith("scheme,train_length,mode,split,length")


def test_after_train_evaluation_files_exist(trained_runs):
    for run, _ in trained_runs.values():
        rows = json.loads((run / "extrapolation" / "extrapolation.json").read_text())
        assert {r["length"] for r in rows} == {16, 32, 64}


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if scheme_class(s).shift_invariant])
def test_checkpoint_offset_invariance(trained_runs, scheme):
    """eval.position_offset leaves the perplexity of a trained shift-invariant scheme as it is."""
    ckpt = trained_runs[scheme][0] / "checkpoints" / "best.ckpt"
    cfg = dict(factors=[1, 4], modes=["nonoverlapping"])
    base = score_checkpoint(ckpt, eval_cfg(**cfg))
    shifted = score_checkpoint(ckpt, eval_cfg(position_offset=777, **cfg))
    for a, b in zip(base, shifted, strict=True):
        assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-4)


def test_learned_beyond_its_table(trained_runs, tmp_path):
    ckpt = trained_runs["learned"][0] / "checkpoints" / "best.ckpt"
    with pytest.raises(ConfigError, match="beyond the table"):
        evaluate_checkpoint(ckpt, eval_cfg(unsupported="error"), out_dir=tmp_path)
    rows = evaluate_checkpoint(ckpt, eval_cfg(unsupported="skip"), out_dir=tmp_path)
    ok = [r["status"] == "ok" for r in rows if r["mode"] == "nonoverlapping"]
    assert ok == [True, False, False, False, False]  # 16 fits the 16-row table, 32…256 do not
    clamped = evaluate_checkpoint(
        ckpt,
        eval_cfg(unsupported="error", pos_overrides={"beyond_table": "clamp"}),
        out_dir=tmp_path,
    )
    assert all(r["status"] == "ok" for r in clamped)


def test_one_stride_serves_every_length(trained_runs, tmp_path):
    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    rows = evaluate_checkpoint(
        ckpt, eval_cfg(modes=["sliding"], stride=48, factors=[1, 4]), out_dir=tmp_path
    )
    assert [r["stride"] for r in rows] == [16, 48]  # capped at the 16-token window


def test_eval_py_cli_prints_the_table(trained_runs, tmp_path, monkeypatch, capfd):
    run, _ = trained_runs["rope"]
    result = run_in_process(
        "eval",
        [
            f"run={run}",
            "eval.max_tokens=800",
            "eval.factors=[1,16]",
            "eval.modes=[nonoverlapping,sliding]",
            f"out_dir={tmp_path}",
            "wandb=false",
        ],
        tmp_path,
        monkeypatch,
        capfd,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| nonoverlapping |" in result.stdout and "| sliding |" in result.stdout
    assert (tmp_path / "extrapolation" / "extrapolation.json").is_file()
    # with out_dir= nothing else is created: no outputs/eval/DATE/TIME, no .hydra/; only the
    # record of the run it evaluated
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["eval.log", "evaluated_run.json", "extrapolation"]
    (tmp_path / "foreign.ckpt").write_bytes(b"not a checkpoint")
    cases = (("missing.ckpt", "does not exist"), ("foreign.ckpt", "is corrupt or incomplete"))
    for name, message in cases:
        bad = run_in_process("eval", [f"ckpt={tmp_path / name}"], tmp_path, monkeypatch, capfd)
        assert bad.returncode == 2 and message in bad.stderr
        assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_bf16_and_fp32_perplexities_agree_on_a_trained_checkpoint(trained_runs, scheme):
    """eval.precision=bf16-mixed (auto's choice on bf16-native hardware) changes perplexity by
    less than 0.5% at the training length and at 4× it."""
    ckpt = trained_runs[scheme][0] / "checkpoints" / "best.ckpt"
    cfg = dict(factors=[1, 4], max_tokens=600)
    fp32 = score_checkpoint(ckpt, eval_cfg(precision="32-true", **cfg))
    bf16 = score_checkpoint(ckpt, eval_cfg(precision="bf16-mixed", **cfg))
    for a, b in zip(fp32, bf16, strict=True):
        assert a["tokens"] == b["tokens"] > 0
        assert abs(b["ppl"] - a["ppl"]) / a["ppl"] < 0.005, (a["length"], a["ppl"], b["ppl"])


def test_max_tokens_auto_caps_only_a_short_runs_evaluation_and_says_so(
    trained_runs, tmp_path, monkeypatch, capsys
):
    ckpt = trained_runs["nope"][0] / "checkpoints" / "best.ckpt"
    monkeypatch.setattr(poslab.evaluation.recorded, "AUTO_MIN_TOKENS", 500)
    cfg = eval_cfg(max_tokens="auto", factors=[1])
    whole = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "a")  # eval.py: no training budget
    assert "eval.max_tokens=auto" not in capsys.readouterr().out
    capped = evaluate_checkpoint(ckpt, cfg, out_dir=tmp_path / "b", trained_tokens=100)
    assert "eval.max_tokens=auto: scoring the first" in capsys.readouterr().out
    assert capped[0]["tokens"] <= 500 < whole[0]["tokens"]


@pytest.mark.parametrize("setting", [0, 1, -5, "many", 2.5, True])
def test_max_tokens_rejects_what_is_not_a_token_count(setting):
    with pytest.raises(ConfigError, match="eval.max_tokens"):
        scored_token_cap(setting, None)


def test_max_tokens_values():
    assert scored_token_cap(None, 10) is None
    assert scored_token_cap(1000, None) == 1000
    assert scored_token_cap("auto", None) is None
    assert scored_token_cap("auto", 10**7) == 10**7
    assert scored_token_cap("auto", 10) == poslab.evaluation.recorded.AUTO_MIN_TOKENS


def test_a_length_the_scored_tokens_cannot_fill_is_skipped_never_ok(trained_runs):
    """eval.lengths=[32,1000000] once gave an `ok` row at 1,000,000 from 1,859 tokens."""
    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    rows = score_checkpoint(ckpt, eval_cfg(max_tokens=200, lengths=[16, 1000000]))
    by_length = {r["length"]: r for r in rows}
    assert by_length[16]["status"] == "ok" and by_length[16]["tokens"] > 0
    far = by_length[1000000]
    assert re.fullmatch(
        r"skipped: the 1\d\d scored tokens hold 0 full windows of 1,000,000 \(at least 4\); "
        r"raise eval.max_tokens or use a longer split",
        far["status"],
    ), far["status"]
    assert "tokens" not in far and "ppl" not in far


@pytest.mark.parametrize("length", [1, 7, 16, 100])
def test_the_window_minimum_counts_the_windows_the_scorer_makes(length):
    from poslab.evaluation.perplexity import MIN_FULL_WINDOWS, make_windows, too_few_windows

    for num_tokens in range(2, 6 * length + 3):
        full = sum(w.length == length for w in make_windows(num_tokens, length, "nonoverlapping"))
        assert (too_few_windows(num_tokens, length) is None) == (full >= MIN_FULL_WINDOWS)


def test_eval_py_never_writes_into_a_training_runs_own_results(
    trained_runs, tmp_path, monkeypatch, capfd
):
    from processes import folder_digest

    run, _ = trained_runs["alibi"]
    before = folder_digest(run / "extrapolation")
    result = run_in_process("eval", [f"run={run}", f"out_dir={run}"], tmp_path, monkeypatch, capfd)
    assert result.returncode == 2
    assert f"error: out_dir={run} is a training run's folder" in result.stderr
    assert folder_digest(run / "extrapolation") == before


def _changed_train_text(corpus, folder):
    """A copy of the corpus whose train.txt gained lines of new words at its top: a tokenizer
    retrained on it gives other ids (and the same validation text)."""
    from conftest import copy_corpus

    other = copy_corpus(corpus, folder)
    lines = "".join(f" zq{i} zr{i} zs{i} the .\n" for i in range(300))
    (other / "train.txt").write_text(lines + (other / "train.txt").read_text())
    return other


def test_a_run_is_scored_with_its_own_tokenizer_whatever_the_corpus_gives_now(
    trained_runs, corpus, tmp_path
):
    """eval.py run=RUN data_path=OTHER (the same valid.txt, another train.txt) once scored a
    retrained tokenizer's ids: ppl 137.77 against the run's 88.58, exit code 0 (issue #43)."""
    from poslab.evaluation.run import evaluate_text, plan_checkpoint

    run, _ = trained_runs["rope"]
    ckpt = run / "checkpoints" / "best.ckpt"
    own = json.loads((run / "extrapolation" / "extrapolation.json").read_text())
    other = _changed_train_text(corpus, tmp_path / "other")
    cfg = eval_cfg(factors=[1, 2, 4], modes=["nonoverlapping", "sliding"])
    rows, _ = evaluate_text(plan_checkpoint(ckpt, cfg), None, str(other))
    assert [r["ppl"] for r in rows] == pytest.approx([r["ppl"] for r in own], rel=1e-6)
    # the run keeps its tokenizer beside its checkpoints, as the checkpoints hold it
    from poslab.model.build import read_checkpoint

    assert read_checkpoint(ckpt)["tokenizer"]["json"] == (run / "tokenizer.json").read_text()


def test_a_validation_text_changed_in_place_is_refused_unless_asked_for(corpus, tmp_path):
    from conftest import copy_corpus, train_in_process

    from poslab.evaluation.run import evaluate_text, plan_checkpoint

    mine = copy_corpus(corpus, tmp_path / "corpus")
    train_in_process("nope", mine, tmp_path / "run", ["eval.after_train=false"])
    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    valid = mine / "valid.txt"
    valid.write_text(" the extra line .\n" + valid.read_text())
    with pytest.raises(ConfigError, match=f"the validation text {valid} changed since this run"):
        evaluate_text(plan_checkpoint(ckpt, eval_cfg(factors=[1])), None, None)
    rows, _ = evaluate_text(plan_checkpoint(ckpt, eval_cfg(factors=[1])), None, str(mine))
    assert rows[0]["status"] == "ok"  # data_path= asks for the new text, and the report says so
    from poslab.report.tables import scored_note

    said = f"data_path={mine}: not the validation text the run recorded"
    assert rows[0]["other_text"] == said and said in scored_note(rows)


def test_a_reevaluation_scores_what_the_run_scored_unless_told_otherwise(
    trained_runs, tmp_path, monkeypatch, capfd
):
    """eval.py run=RUN once scored the whole split where the run's table scored its first
    65,536 tokens: the same model 4 points apart (issue #43). It now takes the run's scoring
    options, says which, and prints each row beside the run's own."""
    run, _ = trained_runs["rope"]
    own = json.loads((run / "extrapolation" / "extrapolation.json").read_text())
    args = [f"run={run}", f"out_dir={tmp_path / 'a'}", "wandb=false"]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (
        "scoring as the run's own evaluation did: eval.factors=[1,2,4] "
        "eval.modes=[nonoverlapping,sliding] eval.max_tokens=1500" in result.stdout
    )
    rows = json.loads((tmp_path / "a" / "extrapolation" / "extrapolation.json").read_text())
    assert [(r["mode"], r["length"], r["tokens"]) for r in rows] == [
        (r["mode"], r["length"], r["tokens"]) for r in own
    ]
    assert [r["ppl"] for r in rows] == pytest.approx([r["ppl"] for r in own], rel=1e-6)
    assert result.stdout.count("(+0.0%)") == len(own)
    # a typed option wins, and rows scored on other tokens are not set beside the run's
    args = [f"run={run}", f"out_dir={tmp_path / 'b'}", "wandb=false", "eval.max_tokens=null"]
    result = run_in_process("eval", args, tmp_path, monkeypatch, capfd)
    assert result.returncode == 0, result.stderr[-2000:]
    taken = result.stdout.split("scoring as the run's own evaluation did: ")[1].split(" (")[0]
    assert taken == "eval.factors=[1,2,4] eval.modes=[nonoverlapping,sliding]"
    rows = json.loads((tmp_path / "b" / "extrapolation" / "extrapolation.json").read_text())
    assert rows[0]["tokens"] > own[0]["tokens"] and rows[0]["max_tokens"] is None
    assert "beside the run's own table" not in result.stdout


def test_a_recorded_auto_cap_is_the_cap_the_runs_table_was_scored_under(tmp_path):
    from omegaconf import OmegaConf

    from poslab.evaluation.recorded import with_recorded_settings

    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    config = {"data": {"seq_len": 64}, "eval": {"max_tokens": "auto", "factors": [1, 2]}}
    asked = OmegaConf.create({"max_tokens": None, "factors": [1, 2, 4, 8, 16], "lengths": None})
    # no table yet (eval.after_train=false): the cap the trained tokens give
    cfg, taken = with_recorded_settings(asked, config, ckpt, set(), trained_tokens=10**6)
    assert (cfg.max_tokens, list(cfg.factors)) == (10**6, [1, 2])
    assert taken == ["eval.factors=[1,2]", "eval.max_tokens=1000000"]
    table = tmp_path / "run" / "extrapolation" / "extrapolation.json"
    table.parent.mkdir(parents=True)
    table.write_text(json.dumps([{"mode": "nonoverlapping", "length": 64, "max_tokens": 65536}]))
    cfg, _ = with_recorded_settings(asked, config, ckpt, set(), trained_tokens=10**6)
    assert cfg.max_tokens == 65536
    # typed on the command line: kept; typed lengths make the recorded factors moot
    cfg, taken = with_recorded_settings(asked, config, ckpt, {"max_tokens", "lengths"}, 10**6)
    assert (cfg.max_tokens, list(cfg.factors), taken) == (None, [1, 2, 4, 8, 16], [])
    # documents typed: the run's split options do not apply to them (they would be refused)
    config["eval"]["modes"] = ["nonoverlapping", "sliding"]
    asked.documents = "books/"
    cfg, taken = with_recorded_settings(asked, config, ckpt, {"documents"}, 10**6)
    assert taken == ["eval.factors=[1,2]"]


def test_typed_factors_win_over_recorded_lengths(tmp_path):
    """#60: `eval.py run=RUN eval.factors=[1,2]` on a run that recorded eval.lengths=[32,64,128]
    scored the recorded lengths: the typed factors must decide the lengths."""
    from omegaconf import OmegaConf

    from poslab.evaluation.recorded import with_recorded_settings
    from poslab.run.validate import eval_lengths

    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    config = {"data": {"seq_len": 16}, "eval": {"lengths": [32, 64, 128], "factors": [1, 2, 4]}}
    asked = OmegaConf.create({"factors": [1, 2], "lengths": None})
    cfg, taken = with_recorded_settings(asked, config, ckpt, {"factors"}, trained_tokens=10**6)
    assert (eval_lengths(cfg, 16), taken) == ([16, 32], [])
    # neither typed: the run's own lengths, as before
    cfg, taken = with_recorded_settings(asked, config, ckpt, set(), trained_tokens=10**6)
    assert eval_lengths(cfg, 16) == [32, 64, 128]


def _scored_tokens_of_the_text(path, cap):
    """The targets a split file gives, counted from its text alone: a word-level line is its
    words and its line end; a cap keeps whole lines (the first line end before the text counts
    as context, not as a target)."""
    total = 0
    for line in path.read_text().splitlines():
        n = len(line.split()) + 1
        if cap is not None and total + n > cap:
            break
        total += n
    return total


@pytest.mark.parametrize("split", ["validation", "test"])
@pytest.mark.parametrize("cap", [None, 900])
def test_every_row_the_plan_scores_counts_the_tokens_and_windows_the_data_gives(
    trained_runs, corpus, split, cap
):
    """The property of issue #43: for every split × mode × length, an `ok` row's tokens are the
    split's (capped) tokens and its windows the count the length and stride cut them into,
    both computed from the text file; a length they cannot fill 4 times is skipped, never ok."""
    ckpt = trained_runs["rope"][0] / "checkpoints" / "best.ckpt"
    lengths, stride = [7, 16, 100, 301, 551, 2000], 37
    cfg = eval_cfg(
        split=split,
        max_tokens=cap,
        lengths=lengths,
        modes=["nonoverlapping", "sliding"],
        stride=stride,
    )
    rows = score_checkpoint(ckpt, cfg)
    file = corpus / {"validation": "valid.txt", "test": "test.txt"}[split]
    targets = _scored_tokens_of_the_text(file, cap)
    assert len(rows) == 2 * len(lengths)
    statuses = set()
    for row in rows:
        length = row["length"]
        if targets // length < 4:
            assert row["status"].startswith("skipped: "), row
            continue
        statuses.add(row["status"])
        assert (row["tokens"], row["words"]) == (targets, targets), (row["mode"], length)
        step = min(stride, length)
        expected = (
            -(-targets // length)
            if row["mode"] == "nonoverlapping"
            else 1 + -(-max(0, targets - length) // step)
        )
        assert row["windows"] == expected, (row["mode"], length)
    assert statuses == {"ok"}
    # both kinds of row occur in this grid
    assert any(r["status"] != "ok" for r in rows) and any(r["status"] == "ok" for r in rows)


def test_a_checkpoint_without_a_tokenizer_record_is_refused_once_its_corpus_changed(
    corpus, tmp_path
):
    """Checkpoints from before runs kept their tokenizer are scored with one rebuilt from the
    corpus; where the token cache shows the corpus changed since, that tokenizer is known to
    be another one: one line, no numbers (issue #43)."""
    import torch
    from conftest import copy_corpus, train_in_process

    from poslab.evaluation.run import evaluate_text, plan_checkpoint

    mine = copy_corpus(corpus, tmp_path / "corpus")
    train_in_process("nope", mine, tmp_path / "run", ["eval.after_train=false"])
    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    old = torch.load(ckpt, map_location="cpu", weights_only=False)
    del old["tokenizer"]  # as a checkpoint saved before the record was
    torch.save(old, ckpt)
    rows, _ = evaluate_text(plan_checkpoint(ckpt, eval_cfg(factors=[1])), None, None)
    assert rows[0]["status"] == "ok"  # the corpus it trained on: scored
    train = mine / "train.txt"
    train.write_text(" zq zr zs the .\n" * 50 + train.read_text())
    with pytest.raises(ConfigError, match="holds no record of its tokenizer .* corpus changed"):
        evaluate_text(plan_checkpoint(ckpt, eval_cfg(factors=[1])), None, None)


def test_a_whole_eval_group_says_which_recorded_settings_it_replaces(tmp_path, capsys):
    """#60: `eval=default` dropped every recorded setting without the "scoring as" line."""
    from omegaconf import OmegaConf

    from poslab.evaluation.plan import recorded_settings

    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    config = {
        "data": {"seq_len": 16, "batch_size": 4},
        "trainer": {},
        "eval": {"factors": [1, 2], "max_tokens": 1000, "split": "validation"},
    }
    asked = OmegaConf.create({"factors": [1, 2, 4], "max_tokens": None, "split": "validation"})
    cfg = recorded_settings(asked, config, ckpt, {"*"}, {"global_step": 10})
    assert list(cfg.factors) == [1, 2, 4]  # the group given wins, as before
    out = capsys.readouterr().out
    assert "not as the run's own evaluation did: eval.factors=[1,2] eval.max_tokens=1000" in out


def test_a_recorded_short_context_that_clashes_is_said_to_come_from_the_run(tmp_path):
    """#60: a recorded short_context=8 with a typed eval.modes=[sliding] was refused as if the
    8 had been typed."""
    from omegaconf import OmegaConf

    from poslab.errors import ConfigError
    from poslab.evaluation.plan import recorded_settings

    ckpt = tmp_path / "run" / "checkpoints" / "best.ckpt"
    config = {
        "data": {"seq_len": 16, "batch_size": 4},
        "trainer": {},
        "eval": {"short_context": 8, "modes": ["nonoverlapping"]},
    }
    asked = OmegaConf.create({"short_context": None, "modes": ["sliding"]})
    with pytest.raises(ConfigError) as refused:
        recorded_settings(asked, config, ckpt, {"modes"}, {"global_step": 10})
    assert "(eval.short_context=8, taken from the run's record)" in str(refused.value)
    assert "or set eval.short_context=null" in str(refused.value)

"""scripts/baselines.py: chance and every stated shortcut per length, with no model; for a corpus,
the perplexity of count models that read no positions."""

import numpy as np
import pytest
from conftest import CONF

from poslab.evaluation.baselines import baseline_rows, count_model_rows, main
from poslab.tasks.grid import Grid
from poslab.tasks.needle import Needle


def test_grid_copy_above_is_the_baseline_a_reader_needs():
    rows = baseline_rows(Grid(), [64], examples=300, seed=1)
    by_name = {r["predictor"]: r for r in rows}
    assert by_name["chance"]["token_accuracy"] == pytest.approx(1 / 8)
    # 1/3 of grids shift by 0 and the rest hit by chance: 1/3 + 2/3 * 1/8 = 0.42 per cell
    assert by_name["the cell above"]["token_accuracy"] == pytest.approx(0.42, abs=0.06)


def test_needle_shortcuts_stay_near_chance_at_every_length():
    task = Needle()
    rows = baseline_rows(task, [64, 256], examples=40, seed=3)
    assert {r["length"] for r in rows} == {64, 256}
    for row in rows:
        assert row["accuracy"] <= task.shortcut_margin + 0.05, row


def test_the_cli_prints_a_task_table(capsys):
    main(["data=needle", "--lengths", "64", "--examples", "5"])
    assert "| 64 | chance |" in capsys.readouterr().out


def test_count_models_of_a_stream_the_previous_token_decides():
    """A cycle through the vocabulary: the unigram cannot do better than a uniform guess, the
    bigram (λ fitted on the training stream's last tenth) next to perfectly."""
    vocab = 50
    train = np.tile(np.arange(vocab), 40)
    evaluated = np.tile(np.arange(vocab), 3)[7:]
    unigram, bigram = count_model_rows(train, evaluated, vocab)
    assert unigram["ppl"] == pytest.approx(vocab, rel=0.01)
    assert bigram["predictor"] == "bigram (λ = 0.95)" and bigram["ppl"] < 1.1
    # λ is fitted on training text only: evaluated on random tokens, where the previous token
    # tells nothing and a smaller λ would score better, it stays the training stream's
    noise = np.random.default_rng(0).integers(0, vocab, 500)
    assert count_model_rows(train, noise, vocab)[1]["predictor"] == bigram["predictor"]
    with pytest.raises(ValueError, match="count models need"):
        count_model_rows(train[:5], evaluated, vocab)


def test_the_cli_scores_a_corpus_with_count_models(capsys, corpus):
    """The toy corpus ties each verb to its noun: the previous token predicts much of it."""
    main(["data=wikitext2", f"data.path={corpus}"])
    out = capsys.readouterr().out
    assert "## wikitext2: count models without positions (validation split" in out
    rows = {
        line.split("|")[1].strip(): float(line.split("|")[2])
        for line in out.splitlines()
        if line.startswith("| unigram") or line.startswith("| bigram")
    }
    unigram = rows.pop("unigram (add-one)")
    (bigram,) = rows.values()
    assert 1 < bigram < unigram / 2
    with pytest.raises(SystemExit) as stop:
        main(["data=wikitext2", f"data.path={corpus}", "--split", "dev"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --split dev: the corpus has")
    with pytest.raises(SystemExit) as stop:  # its own training split: in-sample, refused
        main(["data=wikitext2", f"data.path={corpus}", "--split", "train"])
    assert capsys.readouterr().err.startswith("error: --split train: the count models are fitted")
    with pytest.raises(SystemExit) as stop:  # the data module's own error, not Hydra's wrapper
        main(["data=wikitext2", f"data.path={corpus}/missing"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: data.path={corpus}/missing does not exist")


def test_count_models_score_the_tokens_an_evaluation_capped_at_n_scores(capsys, corpus):
    """--max-tokens N scores what eval.max_tokens=N scores (the first whole lines within N
    tokens, preceded by a line end), so that a model's row and the count models' are
    perplexities of the same text; the header says how many tokens and which vocabulary."""
    from omegaconf import OmegaConf

    from poslab.data.cache import TokenCache
    from poslab.evaluation.baselines import count_model_rows

    main(["data=wikitext2", f"data.path={corpus}", "--max-tokens", "300"])
    out = capsys.readouterr().out
    data = OmegaConf.to_container(OmegaConf.load(CONF / "data" / "wikitext2.yaml"), resolve=True)
    cache = TokenCache.from_config(data, path=str(corpus))
    head = cache.split("validation").head(300)
    assert 200 < len(head.ids) <= 300
    assert f"the first {len(head.ids):,} tokens, as eval.max_tokens=300 scores" in out
    assert "vocabulary version 2" in out
    eos = cache.tokenizer().token_to_id("<eos>")
    train = cache.split("train").ids
    expected = count_model_rows(train, head.after_line_end(eos).ids, cache.meta()["vocab_size"])
    printed = [
        float(line.split("|")[2])
        for line in out.splitlines()
        if line.startswith(("| unigram", "| bigram"))
    ]
    assert printed[-2:] == [round(r["ppl"], 2) for r in expected]
    main(["data=wikitext2", f"data.path={corpus}"])  # the whole split: other numbers
    whole = [
        float(line.split("|")[2])
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("| unigram", "| bigram"))
    ]
    assert whole[-2:] != printed[-2:]
    with pytest.raises(SystemExit) as stop:
        main(["data=wikitext2", f"data.path={corpus}", "--max-tokens", "1"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: --max-tokens 1: give at least 2")

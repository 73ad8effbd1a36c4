"""poslab/report/provenance.py through compare.py: one vocabulary per table, seeds of one row
scored alike, a run given twice, and the provenance every table and figure carries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poslab.errors import ConfigError
from poslab.report.compare import compare, main
from poslab.report.provenance import PROVENANCE_FIELDS, caption, provenance_of_config

LENGTHS = (32, 64, 128)


def rows_of(scheme: str, ppls: list[float], **changed) -> list[dict]:
    """A run's rows at 1x, 2x, 4x L = 32, as eval.py writes them, with `changed` fields."""
    rows = []
    for length, ppl in zip(LENGTHS, ppls, strict=True):
        row = {
            "scheme": scheme,
            "train_length": 32,
            "mode": "nonoverlapping",
            "split": "validation",
            "length": length,
            "factor": length / 32,
            "word_level": True,
            "position_offset": 0,
            "status": "ok",
            "variant": "",
            "precision": "32-true",
            "max_tokens": 2048,
            "stride": length,
            "tokens": 2000,
            "ppl": ppl,
            "loss": 1.0,
            "word_ppl": ppl,
        }
        rows.append({**row, **changed})
    return rows


def write(folder: Path, rows: list[dict], seed: int, vocabulary: int | None = 2) -> Path:
    (folder / "extrapolation").mkdir(parents=True)
    (folder / "extrapolation" / "extrapolation.json").write_text(json.dumps(rows))
    (folder / ".hydra").mkdir()
    version = f"  tokenizer_version: {vocabulary}\n" if vocabulary is not None else ""
    (folder / ".hydra" / "config.yaml").write_text(
        f"seed: {seed}\nmodel_name: tiny\npos:\n  _target_: R\ndata:\n  name: wikitext2\n"
        f"  seq_len: 32\n  batch_size: 4\n{version}trainer:\n  max_steps: 10\n"
        "  precision: 32-true\n"
    )
    return folder


# every evaluation setting that decides what a number is, with a second value for it
SCORED_DIFFERENTLY = {
    "split": "test",
    "max_tokens": None,
    "precision": "bf16-mixed",
    "position_offset": 7,
    "variant": "yarn s=auto",
    "short_context": 8,
    "tokens": 1500,
    "stride": 16,
}


@pytest.mark.parametrize("key", sorted(SCORED_DIFFERENTLY))
def test_seeds_scored_with_different_settings_are_refused_naming_the_setting(tmp_path, key):
    write(tmp_path / "s1", rows_of("rope", [10.0, 11.0, 12.0]), 1)
    write(tmp_path / "s2", rows_of("rope", [10.5, 11.5, 12.5], **{key: SCORED_DIFFERENTLY[key]}), 2)
    with pytest.raises(ConfigError, match=f"row rope: its seeds were scored with different {key}"):
        compare([tmp_path / "s1", tmp_path / "s2"], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before any work


def test_seeds_scored_at_other_lengths_or_modes_are_refused(tmp_path):
    write(tmp_path / "s1", rows_of("rope", [10.0, 11.0, 12.0]), 1)
    write(tmp_path / "s2", rows_of("rope", [10.5, 11.5, 12.5])[:2], 2)  # re-scored at 1x, 2x
    with pytest.raises(ConfigError, match="different lengths and modes"):
        compare([tmp_path / "s1", tmp_path / "s2"], tmp_path / "out")
    sliding = [{**r, "mode": "sliding"} for r in rows_of("rope", [10.5, 11.5, 12.5])]
    write(tmp_path / "s3", sliding, 3)
    with pytest.raises(ConfigError, match="different lengths and modes"):
        compare([tmp_path / "s1", tmp_path / "s3"], tmp_path / "out")


def test_seeds_scored_alike_merge(tmp_path):
    write(tmp_path / "s1", rows_of("rope", [10.0, 11.0, 12.0]), 1)
    write(tmp_path / "s2", rows_of("rope", [12.0, 13.0, 14.0]), 2)
    rows = compare([tmp_path / "s1", tmp_path / "s2"], tmp_path / "out")
    assert [r["n_seeds"] for r in rows] == [2, 2, 2]
    assert rows[0]["ppl"] == pytest.approx(11.0)


def test_a_run_given_twice_is_refused(tmp_path):
    run = write(tmp_path / "sweep" / "s1", rows_of("rope", [10.0, 11.0, 12.0]), 1)
    write(tmp_path / "sweep" / "s2", rows_of("rope", [12.0, 13.0, 14.0]), 2)
    for paths in ([run, run], [tmp_path / "sweep", run]):
        with pytest.raises(ConfigError, match="is given twice"):
            compare(paths, tmp_path / "out")


def test_two_vocabularies_in_one_table_are_refused_in_one_line(tmp_path, capsys):
    write(tmp_path / "v1", rows_of("rope", [10.0, 11.0, 12.0]), 1, vocabulary=None)  # before: 1
    write(tmp_path / "v2", rows_of("alibi", [9.0, 9.0, 9.0]), 1, vocabulary=2)
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "v1"), str(tmp_path / "v2"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "different vocabularies" in err[0] and "vocabulary 1" in err[0]
    assert "Traceback" not in err[0] and not (tmp_path / "out").exists()
    # asked for, they share a table that says so
    compare([tmp_path / "v1", tmp_path / "v2"], tmp_path / "out", mixed_vocabularies=True)
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "**Mixed vocabularies or corpora**" in text


def test_two_vocabularies_are_never_seeds_of_one_row_even_per_seed(tmp_path):
    write(tmp_path / "s1", rows_of("rope", [10.0, 11.0, 12.0]), 1, vocabulary=1)
    write(tmp_path / "s2", rows_of("rope", [12.0, 13.0, 14.0]), 2, vocabulary=2)
    with pytest.raises(ConfigError, match="different vocabulary"):
        compare(
            [tmp_path / "s1", tmp_path / "s2"],
            tmp_path / "out",
            per_seed=["data.tokenizer_version"],
            mixed_vocabularies=True,
        )


def test_every_table_and_figure_says_what_it_rests_on(tmp_path):
    write(tmp_path / "a", rows_of("rope", [10.0, 11.0, 12.0]), 1)
    write(tmp_path / "b", rows_of("alibi", [9.0, 9.0, 9.0]), 1)
    rows = compare([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "### provenance" in text
    assert "| rope | 2 | wikitext2 | tiny | 10 | 1280 | 32-true | 32-true |" in text
    saved = json.loads((tmp_path / "out" / "comparison.json").read_text())
    assert all(set(PROVENANCE_FIELDS) <= set(r["provenance"]) for r in saved)
    line = caption(rows)
    assert "wikitext2, vocabulary 2" in line and "tiny, 10 steps" in line and "32-true" in line


def test_the_training_machine_is_in_the_table_and_the_caption_and_unknown_is_said(tmp_path):
    """Rows written before run.json recorded the machine read it from there, where it is; a
    table mixing two machines names both, and a run without the record says so."""
    write(tmp_path / "a", rows_of("rope", [10.0, 11.0, 12.0]), 1)
    write(tmp_path / "b", rows_of("alibi", [9.0, 9.0, 9.0]), 1)
    (tmp_path / "a" / "run.json").write_text(json.dumps({"machine": "AMD EPYC (1 thread)"}))
    rows = compare([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    text = (tmp_path / "out" / "comparison.md").read_text()
    # these hand-made rows have no code version either: "not recorded" before the machine
    assert "| 32-true | 32-true | not recorded | AMD EPYC (1 thread) |" in text
    assert "| 32-true | 32-true | not recorded | not recorded |" in text  # alibi: no run.json
    assert "trained on AMD EPYC (1 thread), not recorded" in caption(rows)


def test_the_machine_name_says_the_device_and_the_threads():
    import torch

    from poslab.model.precision import cpu_name, machine_name

    torch_threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert machine_name(torch.device("cpu")) == f"{cpu_name()} (1 thread)"
        assert machine_name(torch.device("cpu"), processes=4) == f"4 × {cpu_name()} (1 thread)"
    finally:
        torch.set_num_threads(torch_threads)


def test_provenance_of_a_config_reads_the_vocabulary_and_tokens():
    config = {
        "model_name": "small",
        "data": {"name": "wikitext2", "tokenizer_version": 2, "batch_size": 32, "seq_len": 128},
        "trainer": {"max_steps": 300, "precision": "bf16-mixed"},
    }
    prov = provenance_of_config(config, params=5_000_000)
    assert prov["vocabulary"] == 2 and prov["train_tokens"] == 300 * 32 * 128
    assert prov["code"].startswith(("git ", "poslab ", "unknown"))
    older = {
        **config,
        "data": {k: v for k, v in config["data"].items() if k != "tokenizer_version"},
    }
    assert provenance_of_config(older)["vocabulary"] == 1  # a missing key means version 1
    task = {**config, "data": {"task": "needle", "batch_size": 4, "seq_len": 64}}
    assert provenance_of_config(task)["vocabulary"] is None  # a generated task has no vocabulary


def test_context_use_over_different_short_contexts_is_never_subtracted(tmp_path):
    def measured(scheme, c, gain, seed):
        rows = rows_of(scheme, [10.0, 11.0, 12.0], short_context=c)
        for r in rows:
            r.update(context_gain=gain, key_token_share=0.1, gain_threshold=2.0)
        return write(tmp_path / f"{scheme}-{seed}", rows, seed)

    for seed in (1, 2):
        measured("rope", 8, 0.10 + seed / 100, seed)
        measured("alibi", 16, 0.02 + seed / 100, seed)
    compare(sorted(tmp_path.glob("*-*")), tmp_path / "out", baseline="rope")
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert "16 for alibi; 8 for rope: not comparable gains" in text
    assert "difference to rope: mean gain from the long context" not in text


def test_the_change_of_a_comparison_between_two_vocabularies_is_paired_by_seed(tmp_path):
    from poslab.report.vocabulary_change import vocabulary_change

    # the old table: rope and alibi on vocabulary 1, seeds 1-3, alibi 2, 3, 4 below rope
    for seed, gap in ((1, 2.0), (2, 3.0), (3, 4.0)):
        write(tmp_path / "v1" / f"rope-{seed}", rows_of("rope", [10.0, 11.0, 12.0]), seed, 1)
        alibi = rows_of("alibi", [10.0 - gap, 11.0 - gap, 12.0 - gap])
        write(tmp_path / "v1" / f"alibi-{seed}", alibi, seed, 1)
    compare([tmp_path / "v1"], tmp_path / "old", baseline="rope")
    # the new runs: the same seeds on vocabulary 2, each gap 1 wider
    for seed, gap in ((1, 3.0), (2, 4.0), (3, 5.0)):
        write(tmp_path / "v2" / f"rope-{seed}", rows_of("rope", [9.0, 9.5, 10.0]), seed, 2)
        alibi = rows_of("alibi", [9.0 - gap, 9.5 - gap, 10.0 - gap])
        write(tmp_path / "v2" / f"alibi-{seed}", alibi, seed, 2)
    records = vocabulary_change(
        tmp_path / "old" / "comparison.json", [tmp_path / "v2"], "rope", tmp_path / "out", "t"
    )
    at_l = next(r for r in records if r["length"] == 32)
    assert at_l["old"]["mean"] == pytest.approx(-3.0) and at_l["new"]["mean"] == pytest.approx(-4.0)
    assert at_l["change"]["mean"] == pytest.approx(-1.0) and at_l["seeds"] == ["1", "2", "3"]
    assert "| alibi | nonoverlapping | 32 |" in (tmp_path / "out" / "change.md").read_text()


def test_rows_merged_again_list_each_value_once():
    """A budget axis merges rows already merged over seeds: a field that is a list there gives
    its values once each (the figure's caption named 517c01f three times before)."""
    from poslab.report.provenance import merged_provenance

    rows = [{"code": ["git a", "git b"], "vocabulary": 2}, {"code": ["git b", "git c"]}]
    rows.append({"code": "git a", "vocabulary": 2})
    merged = merged_provenance(rows)
    assert merged["code"] == ["git a", "git b", "git c"]
    assert merged["vocabulary"] == [2, None]


def test_a_caption_counts_many_code_versions_and_names_a_few():
    rows = [
        {"provenance": {"code": f"git {k:07x}", "corpus": "wikitext2"}, "precision": "32-true"}
        for k in range(6)
    ]
    assert "code from 6 commits (each row's in the provenance table)" in caption(rows)
    assert "code git 0000000, git 0000001;" in caption(rows[:2])

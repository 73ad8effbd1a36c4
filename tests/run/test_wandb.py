"""W&B offline runs as `wandb sync` would upload them, read back with W&B's own reader of the
.wandb transaction log (`wandb leet inspect`): a training run's config, summary, table and figures,
and a merged comparison logged once as its own run of the group."""

from __future__ import annotations

from conftest import TINY, compose_train
from processes import wandb_view

from poslab.report.compare import compare
from poslab.run.tracking import log_comparison


def test_an_offline_run_holds_its_config_summary_table_and_figures(corpus, tmp_path, capfd):
    from poslab.run.training import run_training

    overrides = [o for o in TINY if not o.startswith("logger=")]
    cfg = compose_train(["pos=alibi", f"data.path={corpus}", *overrides, "logger=wandb"], tmp_path)
    run_training(cfg)
    # wandb >= 0.19 warns about `anonymous` whenever it is passed at all (Lightning passes None)
    assert "anonymous setting" not in capfd.readouterr().err

    summary, run = wandb_view(tmp_path / "wandb")
    assert summary["state"] == "finished" and run["job_type"] == "train"
    config = summary["config"]["config"]
    assert config["pos"]["_target_"].endswith("ALiBi") and config["data"]["seq_len"] == 16
    values = summary["summary"]
    for length in (16, 32, 64):  # eval.factors=[1,2,4] at L = 16, both modes
        for mode in ("nonoverlapping", "sliding"):
            assert values[f"extrapolation/{mode}/ppl@{length}"] > 1
    assert values["extrapolation/table"]["_type"] == "table-file"
    assert values["extrapolation/table"]["nrows"] == 6
    images = [k for k, v in values.items() if isinstance(v, dict) and v["_type"] == "image-file"]
    assert "extrapolation/ppl_plot" in images
    assert values["val/loss"] < 9.0  # it learned: a uniform guess over this vocabulary is higher


def test_a_merged_comparison_is_one_wandb_run_of_the_group_logged_once(trained_runs, tmp_path):
    study = tmp_path / "study"
    folder = study / "comparison"
    compare([trained_runs["rope"][0], trained_runs["alibi"][0]], folder, baseline="rope")
    logger = {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "poslab"}

    where = log_comparison(folder, logger, "study-demo", "demo")
    assert where is not None and where.parent == study / "wandb"
    summary, run = wandb_view(study / "wandb")
    assert run["job_type"] == "comparison" and run["run_group"] == "study-demo"
    values = summary["summary"]
    assert values["comparison/table"]["_type"] == "table-file"
    assert (
        values["comparison/table"]["nrows"]
        == len((folder / "comparison.csv").read_text().splitlines()) - 1
    )
    assert values["comparison/report"]["_type"] == "html-file"  # the differences and Holm p
    assert values["comparison/comparison_ppl"]["_type"] == "image-file"
    assert values["comparison/rows"] == 2

    # the same comparison again (a study run again with nothing new): not a second W&B run
    assert log_comparison(folder, logger, "study-demo", "demo") is None
    assert len(list((study / "wandb").glob("offline-run-*"))) == 1
    # runs that logged elsewhere: nothing in W&B
    csv_logger = {"_target_": "lightning.pytorch.loggers.CSVLogger"}
    assert log_comparison(folder, csv_logger, "g", "demo") is None


def test_a_runs_group_is_its_config_then_wandbs_variable_then_the_sweep_or_study(
    monkeypatch, tmp_path
):
    """The group a job logs to and the group its sweep's or study's comparison logs to come from
    one rule: logger.group, else WANDB_RUN_GROUP (the study driver sets it), else the sweep's or
    study's name (else the run's own name)."""
    from poslab.run.tracking import build_logger, wandb_group

    logger_cfg = {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "poslab"}
    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    assert wandb_group(logger_cfg, "sweep-folder") == "sweep-folder"
    config = {"logger": dict(logger_cfg), "run_name": "r"}
    build_logger(config, tmp_path)
    assert config["logger"]["group"] == "r"  # a single run outside a sweep: its own name

    monkeypatch.setenv("WANDB_RUN_GROUP", "study-demo")
    assert wandb_group(logger_cfg, "sweep-folder") == "study-demo"
    config = {"logger": dict(logger_cfg), "run_name": "r"}
    build_logger(config, tmp_path)
    assert config["logger"]["group"] == "study-demo"

    mine = {**logger_cfg, "group": "mine"}
    assert wandb_group(mine, "sweep-folder") == "mine"
    config = {"logger": dict(mine), "run_name": "r"}
    build_logger(config, tmp_path)
    assert config["logger"]["group"] == "mine"


def test_a_damaged_comparison_file_is_a_warning_and_leaves_no_run_open(
    trained_runs, tmp_path, caplog
):
    """A figure that cannot be read: the comparison is not logged (a warning), the W&B run it
    opened is finished, and nothing marks it logged, so the next end of the study tries again."""
    import wandb

    study = tmp_path / "study"
    folder = study / "comparison"
    compare([trained_runs["rope"][0], trained_runs["alibi"][0]], folder, baseline="rope")
    (folder / "comparison_ppl.png").write_bytes(b"x")
    logger = {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "poslab"}
    assert log_comparison(folder, logger, "g", "demo") is None
    assert "the comparison was not logged to W&B" in caplog.text
    assert wandb.run is None
    assert not (study / "wandb" / "comparison-logged.sha256").exists()

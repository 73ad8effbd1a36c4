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


def test_a_study_names_its_jobs_group_in_wandbs_variable(monkeypatch, tmp_path):
    """A job of a study (the driver sets WANDB_RUN_GROUP) joins the study's group, unless its
    config names one; a sweep's job without either takes the sweep's folder name."""
    from poslab.run.tracking import build_logger

    monkeypatch.setenv("WANDB_RUN_GROUP", "study-demo")
    logger_cfg = {"_target_": "lightning.pytorch.loggers.WandbLogger", "project": "poslab"}
    config = {"logger": dict(logger_cfg), "run_name": "r"}
    build_logger(config, tmp_path)
    assert config["logger"]["group"] == "study-demo"
    config = {"logger": {**logger_cfg, "group": "mine"}, "run_name": "r"}
    build_logger(config, tmp_path)
    assert config["logger"]["group"] == "mine"

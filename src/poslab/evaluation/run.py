"""Evaluate a checkpoint at lengths beyond its training length: `python eval.py ckpt=PATH`.

The evaluation is planned once (plan.py: the checkpoint read once, the lengths, one model per
set of eval-time options); a text checkpoint is scored here, window by window over a corpus
split (perplexity.py), a task checkpoint on fresh examples (tasks.py)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from poslab.data.cache import TokenCache, check_unrecorded_tokenizer
from poslab.data.tokens import EOS, TokenizedSplit
from poslab.errors import ConfigError
from poslab.evaluation.perplexity import score, too_few_windows
from poslab.evaluation.plan import EvalPlan, plan_checkpoint, resolved
from poslab.evaluation.recorded import (
    comparison_lines,
    given_eval_keys,
    run_table,
    scored_token_cap,
)
from poslab.evaluation.tasks import evaluate_task_plan
from poslab.model.precision import AUTOCAST_DTYPE
from poslab.report.files import default_out_dir, report_rows
from poslab.report.tables import NO_DOCUMENT, metric_name
from poslab.run.run_folder import checkpoint_of_run
from poslab.run.tracking import start_eval_wandb_run
from poslab.run.validate import check_eval_config

log = logging.getLogger(__name__)


def evaluate_checkpoint(
    ckpt: str | Path,
    eval_cfg: Any,
    cache: TokenCache | None = None,
    out_dir: str | Path | None = None,
    wandb_run: Any = None,
    data_path: str | None = None,
    trained_tokens: int | None = None,
) -> list[dict]:
    """Score the checkpoint at every eval length and mode; write reports; return the rows.
    `trained_tokens` (after training) lets `eval.max_tokens=auto` cap a short run's evaluation.
    A checkpoint trained on a generated task (data=passkey, ...) is scored on that task."""
    plan = plan_checkpoint(ckpt, eval_cfg, trained_tokens=trained_tokens)
    return evaluate_plan(plan, cache, out_dir, wandb_run, data_path)


def evaluate_plan(
    plan: EvalPlan,
    cache: TokenCache | None = None,
    out_dir: str | Path | None = None,
    wandb_run: Any = None,
    data_path: str | None = None,
) -> list[dict]:
    """Score what `plan` says, write the reports (and W&B's copy); returns the rows."""
    if plan.is_task:
        rows, title = evaluate_task_plan(plan)
    else:
        rows, title = evaluate_text(plan, cache, data_path)
    return report_rows(rows, title, plan.ckpt, out_dir, plan.eval_cfg, wandb_run)


def evaluate_text(
    plan: EvalPlan, cache: TokenCache | None, data_path: str | None
) -> tuple[list[dict], str]:
    """The rows of a text checkpoint: perplexity per mode and length over the corpus split.
    The plan settled the names and the lengths the scheme cannot represent; this reads the
    split, scores each (mode, length) and hands the rows back for report/ to write."""
    eval_cfg = plan.eval_cfg
    log.info("evaluating on %s with precision %s", plan.device, plan.precision)
    if eval_cfg.get("documents"):
        return evaluate_documents(plan, cache, data_path)
    split, cap = scored_split(plan, cache, data_path)
    if len(split.ids) < 2:
        raise ConfigError(f"the {eval_cfg.split} split has fewer than 2 tokens")
    rows: list[dict] = []
    short = eval_cfg.get("short_context")
    short_nll: dict[int, Any] = {}  # id(model) -> its short pass: one per distinct model
    for mode in eval_cfg.modes:
        for length in plan.lengths:
            # max_tokens: the token cap that cut the split (None: the whole split)
            row = text_row(plan, mode, length, split=eval_cfg.split, max_tokens=cap)
            if plan.other_text:
                row["other_text"] = plan.other_text
            why = plan.unsupported.get(length) or too_few_windows(len(split.ids), length)
            if why:
                if mode == eval_cfg.modes[0]:
                    log.info("%s L=%d: skipped: %s", row["scheme"], length, why)
                rows.append({**row, "status": f"skipped: {why}"})
                continue
            # context use (context_use.py): non-overlapping rows longer than the short context
            measured = bool(short) and mode == "nonoverlapping" and length > short
            scored = score_row(plan, split, row, token_nll=measured)
            if measured:
                add_context_use(plan, split, scored, int(short), short_nll)
            rows.append(scored)
    return rows, f"{plan.scheme_name}: perplexity vs evaluation length"


def add_context_use(
    plan: EvalPlan, split: TokenizedSplit, row: dict, short: int, short_nll: dict[int, Any]
) -> None:
    """The row's long–short difference (context_use.py), from its long pass's per-token NLL
    and a short pass of the model it was scored with (kept in `short_nll` by the model: the
    lengths that share a model share its short pass)."""
    from poslab.evaluation.context_use import DEFAULT_THRESHOLD, context_use, short_context_nll

    eval_cfg, length = plan.eval_cfg, row["length"]
    model = plan.models[length]
    if id(model) not in short_nll:
        short_nll[id(model)] = short_context_nll(
            model.to(plan.device),
            split,
            short,
            batch_size=eval_cfg.batch_size,
            position_offset=int(eval_cfg.position_offset),
            autocast_dtype=AUTOCAST_DTYPE[plan.precision],
        )
    threshold = float(eval_cfg.get("gain_threshold") or DEFAULT_THRESHOLD)
    bucket = int(eval_cfg.bucket_size or max(1, plan.train_length // 32))
    fields = context_use(row.pop("token_nll"), short_nll[id(model)], length, threshold, bucket)
    row.update(short_context=short, **fields)
    log.info(
        "%s L=%d: context gain %.3f nats; %.1f%% key tokens (gain > %g)",
        row["scheme"],
        length,
        fields["context_gain"],
        100 * fields["key_token_share"],
        threshold,
    )


def text_row(plan: EvalPlan, mode: str, length: int, **fields: Any) -> dict:
    """The fields every perplexity row has, before it is scored (`fields`: its own)."""
    return {
        "scheme": plan.scheme_name,
        "train_length": plan.train_length,
        "mode": mode,
        "split": fields.pop("split"),
        "length": length,
        "factor": length / plan.train_length,
        "word_level": bool(plan.model_config["data"].get("word_level")),
        "position_offset": int(plan.eval_cfg.position_offset),
        "status": "ok",
        "vocab_size": model_vocab_size(plan.models[plan.lengths[0]]),
        "variant": plan.variant,
        "precision": plan.precision,
        "provenance": row_provenance(plan),
        **fields,
    }


def row_provenance(plan: EvalPlan) -> dict[str, Any]:
    """What the row rests on (report/provenance.py): the trained run's vocabulary, corpus,
    model, steps, tokens, precision and machine, and the code that scores it. A pretrained HF
    model reads the text with its own tokenizer: no poslab word vocabulary (None), its hub id
    or folder as the model."""
    from poslab.report.files import default_out_dir
    from poslab.report.provenance import provenance_of_config, run_record

    model = plan.models[plan.lengths[0]]
    params = sum(p.numel() for p in model.parameters())
    if plan.tokenizer is not None:
        found = provenance_of_config({}, params, plan.precision)
        return {**found, "vocabulary": None, "model": plan.source, "steps": None}
    run = default_out_dir(plan.ckpt) if plan.ckpt is not None else None
    record = run_record(run)
    return provenance_of_config(plan.config, params, record.get("precision"), record.get("machine"))


def evaluate_documents(
    plan: EvalPlan, cache: TokenCache | None, data_path: str | None
) -> tuple[list[dict], str]:
    """The rows of a per-document evaluation (eval.documents; data/documents.py): at each
    length one window per document long enough, a "documents" mode row counting them; a length
    no document reaches is a skipped row."""
    from poslab.data.documents import load_documents

    eval_cfg = plan.eval_cfg
    encode, start = document_encoder(plan, cache, data_path)
    setting = str(eval_cfg.documents)
    docs = load_documents(
        setting,
        eval_cfg.get("max_documents"),
        plan.lengths,
        encode,
        start,
        eval_cfg.get("min_document_tokens"),
    )
    print(docs.summary(plan.lengths), flush=True)
    rows: list[dict] = []
    for length in plan.lengths:
        chosen = docs.chosen(length)
        row = text_row(
            plan,
            "documents",
            length,
            split="documents",
            documents=len(chosen),
            documents_source=setting,
            max_documents=eval_cfg.get("max_documents"),
            min_document_tokens=eval_cfg.get("min_document_tokens"),
        )
        if length in plan.unsupported:  # none scored there
            rows.append({**row, "status": f"skipped: {plan.unsupported[length]}", "documents": 0})
        elif not chosen:
            status = f"{NO_DOCUMENT} has {length:,} tokens (the longest has {docs.longest:,})"
            log.info("documents L=%d: %s", length, status)
            rows.append({**row, "status": status})
        else:
            rows.append(score_documents(plan, docs, chosen, row))
    return rows, f"{plan.scheme_name}: perplexity of documents vs evaluation length"


def document_encoder(
    plan: EvalPlan, cache: TokenCache | None, data_path: str | None
) -> tuple[Any, int]:
    """How the documents become ids, and the start token: a pretrained model reads them with
    its own tokenizer, a poslab run with the tokenizer of its token cache."""
    from poslab.data.documents import encoder_of_pretrained, encoder_of_run

    if plan.tokenizer is not None:
        from poslab.hf.pretrained import start_token

        return encoder_of_pretrained(plan.tokenizer), start_token(plan.tokenizer)
    tokenizer = checked_cache(plan, cache, data_path).tokenizer()
    return encoder_of_run(tokenizer), tokenizer.token_to_id(EOS)


def score_documents(plan: EvalPlan, docs: Any, chosen: list[int], row: dict) -> dict:
    """`row` scored on one window per chosen document (each document's first L tokens), with
    the documents' own losses and yarn's number, the mean of their perplexities (`ppl` is that
    of all their tokens)."""
    from poslab.evaluation.perplexity import Window

    length = row["length"]
    split, starts = docs.prefixes(chosen, length)
    row = score_row(plan, split, row, [Window(s, length, 0) for s in starts])
    losses = [nll / length for nll in row.pop("nll_per_window")]
    row["document_ppl_mean"] = sum(math.exp(min(x, 700.0)) for x in losses) / len(losses)
    row["document_losses"] = [[docs.names[i], loss] for i, loss in zip(chosen, losses, strict=True)]
    return row


def model_vocab_size(model: Any) -> int:
    """The rows of the model's output matrix (an HF model's config may round its vocab)."""
    return int(model.lm_head.weight.shape[0])


def scored_split(
    plan: EvalPlan, cache: TokenCache | None, data_path: str | None
) -> tuple[TokenizedSplit, int | None]:
    """The tokens the evaluation scores: eval.split of the run's corpus (or of `data_path`),
    capped by eval.max_tokens, from the first line start on; and the cap where it cut the split
    (None where the whole split was scored)."""
    eval_cfg = plan.eval_cfg
    if plan.tokenizer is not None:
        return pretrained_split(plan, data_path)
    cache = checked_cache(plan, cache, data_path)
    split = cache.split(eval_cfg.split)
    cap = scored_token_cap(eval_cfg.max_tokens, plan.trained_tokens)
    if cap is not None and cap >= len(split):
        cap = None  # the cap cut nothing
    if cap is not None:
        whole = len(split)
        split = split.head(cap)
        if eval_cfg.max_tokens == "auto":
            print(
                f"eval.max_tokens=auto: scoring the first {len(split):,} of {whole:,} "
                f"{eval_cfg.split} tokens (this run trained on {plan.trained_tokens:,} tokens); "
                "eval.max_tokens=null scores the whole split",
                flush=True,
            )
    return split.after_line_end(cache.tokenizer().token_to_id(EOS)), cap


def checked_cache(plan: EvalPlan, cache: TokenCache | None, data_path: str | None) -> TokenCache:
    """The token cache (tokens and tokenizer) of the corpus the run trained on, or of
    `data_path`, checked to have the checkpoint's vocabulary. A run that recorded its tokenizer
    is scored with that one: a tokenizer retrained on a train text that changed (or on another
    corpus's) would give other ids to the same words, and other numbers with exit code 0."""
    overrides = {"path": data_path} if data_path else {}
    cache = cache or TokenCache.from_config(plan.model_config["data"], **overrides)
    record = plan.tokenizer_record
    if not record:
        check_unrecorded_tokenizer(cache, plan.ckpt, asked=bool(data_path))
    if record:
        check_scored_text(plan, cache, data_path, record)
        if cache.tokenizer_record()["sha256"] != record["sha256"]:
            log.info(
                "the corpus at %s gives another tokenizer than the run's (its train text "
                "changed, or it is another corpus): scoring with the run's own tokenizer",
                cache.settings["path"] or cache.settings["hub_id"],
            )
            cache = TokenCache.from_config(
                plan.model_config["data"], **overrides, tokenizer_json=record["json"]
            )
    cache_vocab = cache.meta()["vocab_size"]
    model_vocab = plan.models[plan.lengths[0]].config.vocab_size
    if cache_vocab != model_vocab:
        raise ConfigError(
            f"the token cache {cache.folder} has a vocabulary of {cache_vocab} but "
            f"the checkpoint was trained with {model_vocab}; pass the corpus it was "
            "trained on (data_path=) with the same tokenizer settings"
        )
    return cache


def check_scored_text(
    plan: EvalPlan, cache: TokenCache, data_path: str | None, record: dict[str, Any]
) -> None:
    """The split to score is the text the run recorded, unless data_path= asks for another
    corpus (then the log says the text differs)."""
    split = plan.eval_cfg.split
    recorded = ((record.get("inputs") or {}).get("files") or {}).get(split)
    current = (cache.current_inputs() or {}).get(split)
    if not recorded or not current or recorded["sha256"] == current["sha256"]:
        return
    if data_path:
        plan.other_text = f"data_path={data_path}: not the {split} text the run recorded"
        log.info("%s (%s): scoring it as asked", plan.other_text, recorded["path"])
        return
    raise ConfigError(
        f"the {split} text {current['path']} changed since this run trained on it; to score "
        f"the new text pass data_path={Path(current['path']).parent} (the run's tokenizer is "
        "used either way)"
    )


def pretrained_split(plan: EvalPlan, data_path: str | None) -> tuple[TokenizedSplit, int | None]:
    """eval.split of the corpus at `data_path` (run_pretrained_eval refused hf= without one
    before loading), tokenized by the pretrained model's tokenizer, and the eval.max_tokens cap
    where it cut the split."""
    import os

    from poslab.data.corpus import load_corpus
    from poslab.hf.pretrained import encode_text, start_token

    eval_cfg = plan.eval_cfg
    cache_dir = os.environ.get("POSLAB_CACHE", ".cache/poslab")
    lines = load_corpus(None, None, data_path, cache_dir).lines
    if eval_cfg.split not in lines:
        raise ConfigError(f"data_path={data_path} has no {eval_cfg.split} split")
    split = encode_text(plan.tokenizer, lines[eval_cfg.split])
    cap = scored_token_cap(eval_cfg.max_tokens, None)
    if cap is not None and cap < len(split):
        split = split.head(cap)
    else:
        cap = None
    return split.after_line_end(start_token(plan.tokenizer)), cap


def score_row(
    plan: EvalPlan,
    split: TokenizedSplit,
    row: dict,
    windows: list[Any] | None = None,
    token_nll: bool = False,
) -> dict:
    """`row` (mode, length) with the model's scores over `split` added; `windows` (documents:
    one per document) replaces the mode's, and then the row holds their NLLs (nll_per_window);
    `token_nll`: the row holds every target's NLL (`token_nll`, for add_context_use to take)."""
    eval_cfg, length, mode = plan.eval_cfg, row["length"], row["mode"]
    # the stride is capped at the window, so one eval.stride serves every length
    stride = min(length, int(eval_cfg.stride or max(1, length // 2)))
    result = score(
        plan.models[length].to(plan.device),
        split,
        length,
        mode,
        stride if mode == "sliding" else None,
        batch_size=eval_cfg.batch_size,
        position_offset=int(eval_cfg.position_offset),
        bucket_size=int(eval_cfg.bucket_size or max(1, plan.train_length // 32)),
        autocast_dtype=AUTOCAST_DTYPE[plan.precision],
        windows=windows,
        token_nll=token_nll,
    )
    scores = result.to_dict()
    if windows is None:
        del scores["nll_per_window"]
    row = {**row, **{k: v for k, v in scores.items() if not k.startswith("bucket")}}
    row["loss_by_position"] = result.loss_by_position()
    if token_nll:
        row["token_nll"] = result.token_nll
    if not math.isfinite(row["loss"]):
        # a diverged model: reported as such, never as a number or a skipped length
        row["status"] = "nonfinite"
    metric = metric_name([row])
    n = row.get("documents")
    documents = "" if n is None else f"{n} document{'' if n == 1 else 's'}, "
    log.info(
        "%s %s L=%d: ppl %.2f, %s %.3f (%s%d tokens, %.0f tok/s)",
        row["scheme"],
        mode,
        length,
        row["ppl"],
        metric,
        row[metric],
        documents,
        row["tokens"],
        row["tokens_per_s"],
    )
    return row


def check_out_dir(out_dir: Any) -> None:
    """An out_dir that is a training run's folder would replace that run's own results
    (extrapolation/, evaluated_run.json: what compare.py and runs.py read): refused."""
    if not out_dir:
        return
    folder = Path(str(out_dir)).expanduser()
    if (folder / "status.json").is_file() or (folder / "checkpoints").is_dir():
        raise ConfigError(
            f"out_dir={out_dir} is a training run's folder: its extrapolation/ is the run's own "
            "result; leave out_dir out (a new extrapolation-<time>/ goes beside it) or pass "
            "another folder"
        )


def run_eval(cfg: DictConfig) -> list[dict]:
    """Entry point of eval.py: pick the checkpoint, evaluate, optionally log to W&B."""
    hf = cfg.get("hf")
    if sum(map(bool, (cfg.ckpt, cfg.run, hf))) != 1:
        raise ConfigError(
            "pass exactly one of ckpt=PATH (a .ckpt file), run=RUN_DIR or hf=MODEL (a Hugging "
            "Face hub id or a folder saved with save_pretrained)"
        )
    check_out_dir(cfg.out_dir)
    if hf:
        return run_pretrained_eval(cfg)
    if cfg.get("data") is not None:  # a checkpoint is scored on what it was trained on
        raise ConfigError(
            f"data={cfg.data.get('name')} chooses the task of a pretrained model (hf=MODEL); a "
            "checkpoint is scored on its own corpus or task: leave data= out"
        )
    eval_cfg = resolved(cfg.eval)
    check_eval_config(eval_cfg)
    ckpt = Path(cfg.ckpt) if cfg.ckpt else checkpoint_of_run(cfg.run)
    # a missing or foreign file, or an eval-time variant the scheme cannot take: one clear line
    # before anything starts (no W&B run for a command that cannot run)
    given = given_eval_keys()
    plan = plan_checkpoint(ckpt, eval_cfg, checked=True, refuse_corpus_options=True, given=given)
    wandb_run = None
    if cfg.eval.log_wandb and cfg.wandb:
        out = default_out_dir(ckpt) if not cfg.out_dir else Path(cfg.out_dir)
        eval_config = OmegaConf.to_container(cfg.eval, resolve=True)
        wandb_run = start_eval_wandb_run(plan.config, eval_config, out)
    try:
        rows = evaluate_plan(plan, None, cfg.out_dir, wandb_run, cfg.data_path)
    finally:
        if wandb_run is not None:
            wandb_run.finish()
    lines = comparison_lines(rows, run_table(ckpt))
    if lines:
        print("beside the run's own table, on the same tokens:", *lines, sep="\n", flush=True)
    return rows


def run_pretrained_eval(cfg: DictConfig) -> list[dict]:
    """eval.py hf=MODEL: the same evaluation, files and W&B run as for a poslab checkpoint, in
    out_dir or outputs/pretrained/<name>/ (a new folder when that one holds results)."""
    from poslab.evaluation.plan import plan_pretrained
    from poslab.evaluation.pretrained_tasks import evaluate_pretrained_task, task_of_command
    from poslab.names import pretrained_folder

    task = task_of_command(cfg)  # data=<task>: a generated task instead of a corpus
    # what the model is scored on, checked before loading
    documents = cfg.eval.get("documents")
    if task is None and not cfg.data_path and not documents:
        raise ConfigError(
            f"hf={cfg.hf} needs a corpus: pass data_path=DIR (train.txt, valid.txt, test.txt; "
            "e.g. data_path=../shared/data/wikitext-2), eval.documents=PATH (long documents), "
            "or data=needle for a generated task"
        )
    if documents and cfg.data_path:  # a run's data_path gives its tokenizer; hf= has its own
        raise ConfigError(
            f"data_path={cfg.data_path}: eval.documents={documents} is the text hf={cfg.hf} is "
            "scored on (read with its own tokenizer), no corpus is read; leave data_path out, "
            "or eval.documents to score the corpus"
        )
    context, trust = cfg.get("hf_context"), bool(cfg.get("hf_trust_remote_code"))
    wandb = bool(cfg.wandb and cfg.eval.log_wandb)
    plan = plan_pretrained(str(cfg.hf), context, cfg.eval, wandb, trust_remote_code=trust)
    if task is not None:
        rows, title = evaluate_pretrained_task(plan, task, cfg.data)
    else:
        rows, title = evaluate_text(plan, None, cfg.data_path)
    folder = Path(cfg.out_dir) if cfg.out_dir else pretrained_folder(str(cfg.hf))
    wandb_run = None
    if cfg.eval.log_wandb and cfg.wandb:
        eval_config = OmegaConf.to_container(cfg.eval, resolve=True)
        wandb_run = start_eval_wandb_run(plan.config, eval_config, folder)
    try:
        return report_rows(rows, title, folder, cfg.out_dir, plan.eval_cfg, wandb_run, folder)
    finally:
        if wandb_run is not None:
            wandb_run.finish()

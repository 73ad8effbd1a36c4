"""lm-evaluation-harness (`lm-eval`, its `hf` model: HFLM) on an exported poslab model, offline:
a local task (a YAML over a local JSON file) scored through HFLM gives, example by example, the
log-likelihoods and greedy matches poslab's own model computes, and a generation task gives
poslab's greedy continuation, one request at a time and in batches of unequal contexts (HFLM
pads log-likelihood batches on the right without a mask, generation batches on the left)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from exported_models import run_config, trained_looking, word_tokenizer

from poslab.hf.export import export_custom_code

pytest.importorskip("lm_eval")  # the dev extra installs it; a user without it skips

TASK = """task: poslab_local_{kind}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
{extra}"""
LOGLIKELIHOOD = """metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
GENERATE = """generation_kwargs:
  until: ["w0 w0 w0"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def poslab_scores(model: torch.nn.Module, tokenizer, docs: list[dict]) -> list[tuple[float, bool]]:
    """(log-likelihood of the target given the context, whether it is the greedy choice) for
    each doc, as lm-eval defines them, from poslab's own model."""
    scores = []
    for doc in docs:
        context = tokenizer.encode(doc["context"]).ids
        target = tokenizer.encode(doc["target"]).ids
        ids = torch.tensor([context + target])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids)[0, :-1].double(), dim=-1)
        predicted = logprobs[len(context) - 1 :]
        wanted = torch.tensor(target)
        loglikelihood = float(predicted.gather(1, wanted[:, None]).sum())
        scores.append((loglikelihood, bool((predicted.argmax(-1) == wanted).all())))
    return scores


@pytest.mark.slow  # lm-eval and datasets: ~10 s of imports and dataset building
@pytest.mark.parametrize("batch_size", [1, 3])
def test_lm_eval_scores_an_exported_model_offline_as_poslab_does(batch_size, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    config = run_config("alibi", "auto", {})
    model = trained_looking(config)
    tokenizer = word_tokenizer()
    export_custom_code(model, config, tokenizer, tmp_path / "model")
    generator = torch.Generator().manual_seed(3)
    docs = []
    for n in range(6):  # contexts of 4 to 8 words: a batch pads them
        words = [f"w{int(i)}" for i in torch.randint(0, 39, (6 + n % 5,), generator=generator)]
        docs.append({"context": " ".join(words[:-2]), "target": " " + " ".join(words[-2:])})
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for kind, output_type, extra in (
        ("loglikelihood", "loglikelihood", LOGLIKELIHOOD),
        ("generate", "generate_until", GENERATE),
    ):
        (tasks / f"{kind}.yaml").write_text(
            TASK.format(kind=kind, data=data, output_type=output_type, extra=extra)
        )
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tmp_path / 'model'},trust_remote_code=True,dtype=float32",
        tasks=["poslab_local_loglikelihood", "poslab_local_generate"],
        task_manager=TaskManager(include_path=str(tasks)),
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
    )
    samples = sorted(results["samples"]["poslab_local_loglikelihood"], key=lambda s: s["doc_id"])
    ours = poslab_scores(model, tokenizer, docs)
    for sample, (loglikelihood, greedy) in zip(samples, ours, strict=True):
        theirs, is_greedy = sample["resps"][0][0]
        assert math.isclose(float(theirs), loglikelihood, abs_tol=1e-4)
        assert bool(is_greedy) == greedy
    accuracy = results["results"]["poslab_local_loglikelihood"]["acc,none"]
    assert accuracy == pytest.approx(sum(g for _, g in ours) / len(ours))
    # the generation task: HFLM's generate equals poslab's greedy continuation
    generated = sorted(results["samples"]["poslab_local_generate"], key=lambda s: s["doc_id"])
    for sample, doc in zip(generated, docs, strict=True):
        ids = torch.tensor([tokenizer.encode(doc["context"]).ids])
        with torch.no_grad():
            for _ in range(4):
                ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
        continuation = tokenizer.decode(ids[0, -4:].tolist())
        assert sample["resps"][0][0].split() == continuation.split()

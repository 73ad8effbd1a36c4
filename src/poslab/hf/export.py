"""A poslab model as a Hugging Face model (scripts/export_hf.py): a native architecture where
one maps exactly, `learned` positions -> GPT-2, `rope` -> GPT-NeoX; every other model with
poslab's model code in the folder (custom code, `trust_remote_code=True`; bundle.py).

Both are poslab's block (pre-LayerNorm, exact-erf GELU MLP, biases, tied embeddings): GPT-2
adds a learned table like `learned`, GPT-NeoX rotates like `rope` with `pairing=half`. An
`interleaved` rope (RoFormer's pairs 2i, 2i+1) exports too: the query and key rows of each head
are permuted so pair i sits at dims i and i + R/2, which leaves every score unchanged (the Llama
conversion does the same). Missing biases are exported as zeros. What would not give the same
logits natively (another scheme, a learned θ, an attention kernel other than softmax, a window,
scaled embeddings, a concatenated table: `export_problem`) exports as custom code.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from poslab.arguments import OneLineParser, a_path, check_writable
from poslab.errors import (
    NO_SPACE_ERRNOS,
    ConfigError,
    DiskFull,
    exit_on_config_error,
    require_extra,
)
from poslab.model.gpt import GPT, Block

EXPORTS = {"learned": "GPT-2", "rope": "GPT-NeoX"}
EXACT_KERNELS = ("SDPA", "Blockwise", "Flex", "Auto")  # exact softmax attention


V1_EXPORT = (
    "a Hugging Face tokenizer cannot encode the text as its training did; export a run trained "
    "with data.tokenizer_version=2 (the default)"
)


def export_problem(model: GPT, config: dict[str, Any]) -> str | None:
    """Why `model` has no exact HF architecture (None: it has)."""
    from poslab.positions.learned import LearnedPositions
    from poslab.positions.rope import Rotary

    name = config.get("pos_name") or type(model.pos).__name__
    pos = model.pos
    if type(pos) not in (LearnedPositions, Rotary):
        which = ", ".join(f"{k} ({v})" for k, v in EXPORTS.items())
        return f"pos={name} maps to no Hugging Face architecture; the schemes that export: {which}"
    kernel = type(model.attention).__name__
    attention = config.get("attention") or {}
    if kernel not in EXACT_KERNELS or attention.get("window"):
        return (
            f"attention={kernel}{' with a window' if attention.get('window') else ''}: HF's "
            "GPT-2 and GPT-NeoX attend with plain softmax over every earlier token; export a "
            "model trained with attention=sdpa (or auto, blockwise, flex)"
        )
    if model.config.scale_embeddings:
        return "model.scale_embeddings=true: GPT-2 and GPT-NeoX do not scale token embeddings"
    if model.config.gate or model.config.sinks:
        which = f"model.gate={model.config.gate}" if model.config.gate else "model.sinks=true"
        return f"{which}: GPT-2 and GPT-NeoX attention has no output gate and no sink logits"
    if isinstance(pos, LearnedPositions) and pos.joining.combine != "add":
        return "pos.combine=concat: GPT-2 adds its position table to the token embeddings"
    if isinstance(pos, Rotary):
        if pos.theta_param is not None:
            return "pos.learnable_theta=true: GPT-NeoX's frequencies are base^(-2i/R), fixed"
        if pos.scaling is not None:
            return "an eval-time rope scaling: export the trained model (set it in HF's config)"
        if pos.position_dtype != "fp32":
            return f"pos.position_dtype={pos.position_dtype}: GPT-NeoX computes angles in fp32"
    return None


def _bias(linear: nn.Linear) -> Tensor:
    return linear.bias if linear.bias is not None else torch.zeros(linear.out_features)


def _norm(norm: nn.LayerNorm) -> tuple[Tensor, Tensor]:
    return norm.weight, norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)


def to_gpt2(model: GPT) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    hf_config = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=model.pos.max_positions,
        n_embd=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        n_inner=c.d_ff,
        activation_function="gelu",  # exact erf GELU, as poslab's MLP
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=model.ln_f.eps,
        tie_word_embeddings=True,
    )
    hf = GPT2LMHeadModel(hf_config)
    state: dict[str, Tensor] = {
        "transformer.wte.weight": model.tok_emb.weight,
        "transformer.wpe.weight": model.pos.table.weight,
    }
    state["transformer.ln_f.weight"], state["transformer.ln_f.bias"] = _norm(model.ln_f)
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        state[p + "ln_1.weight"], state[p + "ln_1.bias"] = _norm(block.ln_1)
        state[p + "ln_2.weight"], state[p + "ln_2.bias"] = _norm(block.ln_2)
        # GPT-2's Conv1D holds the transpose of a Linear's weight
        for ours, theirs in (
            (block.attn.qkv, "attn.c_attn"),
            (block.attn.proj, "attn.c_proj"),
            (block.mlp.up, "mlp.c_fc"),
            (block.mlp.down, "mlp.c_proj"),
        ):
            state[p + theirs + ".weight"] = ours.weight.t()
            state[p + theirs + ".bias"] = _bias(ours)
    _load(hf, state)
    return hf


def half_pairing_order(head_dim: int, rotary_dims: int) -> Tensor:
    """The dims of a head in the order that puts interleaved pair i (2i, 2i+1) at i, i + R/2."""
    pairs = torch.arange(0, rotary_dims, 2)
    return torch.cat((pairs, pairs + 1, torch.arange(rotary_dims, head_dim)))


def to_gpt_neox(model: GPT, context: int) -> nn.Module:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    c, pos = model.config, model.pos
    head_dim = c.d_model // c.n_head
    hf_config = GPTNeoXConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=c.d_ff,
        hidden_act="gelu",
        max_position_embeddings=context,  # what eval.py hf= states lengths as multiples of
        layer_norm_eps=model.ln_f.eps,
        use_parallel_residual=False,  # poslab's blocks are sequential: x + attn, then + mlp
        rope_parameters={
            "rope_type": "default",
            "rope_theta": pos.base,
            "partial_rotary_factor": pos.rotary_dims / head_dim,
        },
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tie_word_embeddings=False,
    )
    hf = GPTNeoXForCausalLM(hf_config)
    order = (
        half_pairing_order(head_dim, pos.rotary_dims)
        if pos.pairing == "interleaved"
        else torch.arange(head_dim)
    )
    names = {id(param): name for name, param in hf.named_parameters()}
    state: dict[str, Tensor] = {  # the output matrix's name differs between HF versions
        names[id(hf.get_input_embeddings().weight)]: model.tok_emb.weight,
        names[id(hf.get_output_embeddings().weight)]: model.tok_emb.weight,
    }
    state["gpt_neox.final_layer_norm.weight"], state["gpt_neox.final_layer_norm.bias"] = _norm(
        model.ln_f
    )
    for i, block in enumerate(model.blocks):
        state.update(_neox_layer(block, f"gpt_neox.layers.{i}.", c.n_head, c.d_model, order))
    _load(hf, state)
    return hf


def _neox_layer(
    block: Block, p: str, n_head: int, d_model: int, order: Tensor
) -> dict[str, Tensor]:
    """The GPT-NeoX tensors of one poslab block, named under prefix `p`; apart from
    to_gpt_neox because the fused qkv needs its heads regrouped and its q, k dims reordered."""
    head_dim = d_model // n_head
    state: dict[str, Tensor] = {}
    state[p + "input_layernorm.weight"], state[p + "input_layernorm.bias"] = _norm(block.ln_1)
    ln2 = _norm(block.ln_2)
    state[p + "post_attention_layernorm.weight"], state[p + "post_attention_layernorm.bias"] = ln2
    # NeoX's fused qkv is per head [q_h, k_h, v_h]; poslab's is [q; k; v], heads inside
    weight = block.attn.qkv.weight.view(3, n_head, head_dim, d_model)
    bias = _bias(block.attn.qkv).view(3, n_head, head_dim)
    weight = torch.stack((weight[0][:, order], weight[1][:, order], weight[2]), dim=1)
    bias = torch.stack((bias[0][:, order], bias[1][:, order], bias[2]), dim=1)
    state[p + "attention.query_key_value.weight"] = weight.reshape(3 * d_model, d_model)
    state[p + "attention.query_key_value.bias"] = bias.reshape(3 * d_model)
    for ours, theirs in (
        (block.attn.proj, "attention.dense"),
        (block.mlp.up, "mlp.dense_h_to_4h"),
        (block.mlp.down, "mlp.dense_4h_to_h"),
    ):
        state[p + theirs + ".weight"] = ours.weight
        state[p + theirs + ".bias"] = _bias(ours)
    return state


def _load(hf: nn.Module, state: dict[str, Tensor]) -> None:
    """Every learned tensor of the HF model from `state` (its buffers, e.g. inv_freq, are
    computed from its config)."""
    expected = {name for name, _ in hf.named_parameters()}
    missing = expected - set(state)
    if missing:  # a mapping bug, not a user's input
        raise RuntimeError(f"export left HF parameters unset: {sorted(missing)[:4]}")
    with torch.no_grad():
        params = dict(hf.named_parameters())
        for name in expected:
            params[name].copy_(state[name].detach().float())


def export_hf(
    model: GPT, config: dict[str, Any], tokenizer: Any, folder: Path, custom_code: bool = False
) -> nn.Module | None:
    """Write `model` to `folder` as an HF model with its tokenizer (save_pretrained): as GPT-2 or
    GPT-NeoX where the architecture maps exactly, else (or with `custom_code`) with poslab's
    model code beside it (export_custom_code). Returns the native HF model, None for custom
    code (which loads only from the folder)."""
    from poslab.positions.learned import LearnedPositions

    if custom_code or export_problem(model, config):
        export_custom_code(model, config, tokenizer, folder)
        return None
    model = model.float().eval()
    context = int((config.get("data") or {}).get("seq_len") or 2048)  # the training length
    hf = to_gpt2(model) if isinstance(model.pos, LearnedPositions) else to_gpt_neox(model, context)
    hf.eval()
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    hf_tokenizer(tokenizer).save_pretrained(folder)
    return hf


def export_custom_code(model: GPT, config: dict[str, Any], tokenizer: Any, folder: Path) -> None:
    """`model` as an HF model with custom code (`auto_map`, trust_remote_code=True): poslab's
    model code (bundle.py), config.json holding the run's network, the weights as safetensors
    and the tokenizer; torch and transformers load it, without poslab."""
    from omegaconf import OmegaConf
    from safetensors.torch import save_file

    from poslab.hf.bundle import write_bundle
    from poslab.hf.remote.configuration_poslab import PoslabConfig
    from poslab.model.build import attention_config
    from poslab.positions import scheme_configs
    from poslab.positions.extensions import EXTENSION_CONF, extension_names

    seq_len = int(config["data"]["seq_len"])
    network = {
        "model": dict(config["model"]),
        "pos": dict(config["pos"]),
        "attention": dict(attention_config(config)),
    }
    hf_config = PoslabConfig(
        poslab=network,
        vocab_size=model.config.vocab_size,
        train_length=seq_len,
        use_cache=True,  # where the model allows a key/value cache (modeling_poslab.py)
        architectures=["PoslabForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_poslab.PoslabConfig",
            "AutoModelForCausalLM": "modeling_poslab.PoslabForCausalLM",
        },
        **_special_ids(tokenizer),
    )
    # a per-layer schedule builds its members from conf/pos/ resolved at its training length
    registry_length = int(config["pos"].get("train_length") or seq_len)
    kinds = {
        kind: OmegaConf.to_container(OmegaConf.load(EXTENSION_CONF / f"{kind}.yaml"))
        for kind in extension_names()
    }
    folder.mkdir(parents=True, exist_ok=True)
    write_bundle(folder, scheme_configs(registry_length), kinds)
    hf_config.save_pretrained(folder)
    state = {
        f"model.poslab.{name}": tensor.detach().float().contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to tok_emb.weight
    }
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "requirements.txt").write_text(REQUIREMENTS)
    hf_tokenizer(tokenizer).save_pretrained(folder)


# what an exported folder needs (its code imports these and the standard library only)
REQUIREMENTS = "torch>=2.4\ntransformers>=5.0\nsafetensors\n"


def _special_ids(tokenizer: Any) -> dict[str, int]:
    """eos/bos ids of the exported tokenizer (poslab's <eos> ends every line)."""
    from poslab.data.tokens import EOS

    eos = tokenizer.token_to_id(EOS)
    return {} if eos is None else {"eos_token_id": eos, "bos_token_id": eos}


def hf_tokenizer(tokenizer: Any) -> Any:
    """poslab's `tokenizers` tokenizer as a PreTrainedTokenizerFast that reads text as poslab's
    splits were read: a newline is the <eos> every line ended with in training (a normalizer
    puts it there, and <eos> is matched after normalization), so "line\n" text gives the ids of
    poslab's token cache."""
    from tokenizers import AddedToken, Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast

    from poslab.data.tokens import EOS, UNK

    tokenizer = Tokenizer.from_str(tokenizer.to_str())  # a copy: the caller's stays as it is
    word_level = type(tokenizer.model).__name__ == "WordLevel"
    tokenizer.normalizer = normalizers.Replace("\n", f" {EOS} " if word_level else EOS)
    tokenizer.add_special_tokens([AddedToken(EOS, special=True, normalized=True)])
    vocab = tokenizer.get_vocab()
    special = {"eos_token": EOS, "bos_token": EOS}
    if UNK in vocab:
        special["unk_token"] = UNK
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)


def export_and_check(
    run: Path, out: Path, data_path: str | None = None, custom_code: bool = False
) -> tuple[Path, str, float]:
    """scripts/export_hf.py: export a run's best checkpoint to `out` (native where exact, else
    or with `custom_code` poslab's code beside it), load it back as an HF model and compare
    logits with poslab's on a probe; a mismatch is an error. Returns (folder, architecture,
    largest logit gap). The export is written to a folder beside `out` and renamed to it once
    checked, under a lock: `out` is whole or absent, whatever stops the export."""
    from poslab.model.build import load_checkpoint
    from poslab.run.run_folder import RunLock

    ckpt = checkpoint_to_export(run)
    model, config = load_checkpoint(ckpt)
    check_bundled_scheme(model, run)
    if "task" in config["data"]:  # before the tokenizer is read (which may tokenize a corpus)
        raise ConfigError(
            f"{run} was trained on a generated task (data={config['data'].get('name')}), whose "
            "tokens have no text tokenizer; export a run trained on a corpus"
        )
    custom_code = custom_code or export_problem(model, config) is not None
    tokenizer = run_tokenizer(ckpt, config, data_path, option="--data-path ")
    check_exportable_tokenizer(tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)  # the lock and the partial folder live there
    lock = RunLock(out, out.parent / f".{out.name}.export.lock", "export (scripts/export_hf.py)")
    lock.acquire()
    try:
        check_new_folder(out)  # again under the lock: an export that ended meanwhile wrote it
        hf, gap = write_checked(model, config, tokenizer, out, custom_code)
    finally:
        lock.release()
    architecture = type(hf).__name__ + (", custom code" if custom_code else "")
    return out, architecture, gap


def checkpoint_to_export(run: Path) -> Path:
    """The checkpoint `run` names: a .ckpt file, or a run folder's best (else last) one. A
    folder inside a run (its checkpoints/, an eval.py results folder) or an eval.py out_dir
    names the run it belongs to, or evaluated; a study or sweep folder, or a run without a
    checkpoint yet, is one line naming what to pass (eval.py's advice, ckpt=PATH, was no
    option of this command)."""
    from poslab.run.run_folder import checkpoint_of_run

    if not run.exists():
        raise ConfigError(f"{run} does not exist; pass a run folder or a .ckpt file")
    if run.suffix == ".ckpt":
        return run
    if run.is_dir() and not (run / "checkpoints").is_dir():
        run = _run_of(run)
    if not (run / "checkpoints").is_dir():
        # a sweep's runs are its subfolders, a study's are under runs/
        found = [*run.glob("*/checkpoints"), *run.glob("runs/*/checkpoints")]
        inside = sorted(p.parent for p in found)
        if inside:
            raise ConfigError(
                f"{run} holds {len(inside)} run(s), e.g. {inside[0]}; export one of them"
            )
        if not (run / ".hydra" / "config.yaml").is_file():
            raise ConfigError(
                f"{run} is not a run folder (no checkpoints/); pass a run folder or a .ckpt file"
            )
    try:
        return checkpoint_of_run(run)
    except ConfigError:
        raise ConfigError(
            f"{run} has no checkpoint yet (checkpoints/best.ckpt or last.ckpt: it stopped "
            f"before its first); train it on (python train.py resume={run}) or pass a .ckpt "
            "file"
        ) from None


def _run_of(folder: Path) -> Path:
    """The run a folder belongs to (its checkpoints/ or an eval.py results folder: the run
    above it) or evaluated (an eval.py out_dir records it), else the folder itself."""
    import json

    if (folder.parent / "checkpoints").is_dir():
        return folder.parent
    try:  # evaluated_run.json (poslab.report.files.record_evaluated_run)
        recorded = Path(json.loads((folder / "evaluated_run.json").read_text())["run"])
    except (OSError, ValueError, KeyError, TypeError):
        return folder
    return recorded if recorded.is_dir() else folder


def check_bundled_scheme(model: GPT, run: Path) -> None:
    """A researcher's own scheme (POSLAB_USER, docs/own-scheme.md) is refused: the export
    bundles poslab's modules (bundle.py), and a folder whose model imports the user's module
    would load nowhere else. (Copying it in would need its imports rewritten and its own
    dependencies vetted, as bundle.py does for poslab's.)"""
    from poslab.positions.base import PositionalScheme

    schemes = [m for m in model.pos.modules() if isinstance(m, PositionalScheme)]
    for module in sorted({type(m).__module__ for m in schemes}):
        if module.split(".")[0] != "poslab":
            raise ConfigError(
                f"{run}: its scheme comes from {module}, outside poslab (POSLAB_USER); an export "
                "carries poslab's modules only: add the scheme to poslab/positions/ (one module, "
                "one conf/pos/ file) to export it"
            )


def check_new_folder(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} is not an empty folder; pass a new folder")


def write_checked(
    model: GPT, config: dict[str, Any], tokenizer: Any, out: Path, custom_code: bool
) -> tuple[nn.Module, float]:
    """The export written to `.<out>.<pid>.partial` beside `out`, loaded back and compared with
    poslab's logits, then renamed to `out` (a kill leaves only a hidden partial folder, which
    the next export to `out` removes). No room on the disk: one line, nothing left."""
    import os
    import shutil

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a tiny folder: its shard bar would only crowd stderr
    for stale in out.parent.glob(f".{out.name}.*.partial"):  # killed exports' (the lock is ours)
        shutil.rmtree(stale, ignore_errors=True)
    staging = out.parent / f".{out.name}.{os.getpid()}.partial"
    try:
        export_hf(model, config, tokenizer, staging, custom_code=custom_code)
        hf = AutoModelForCausalLM.from_pretrained(staging, trust_remote_code=custom_code).eval()
        gap = logit_gap(model, hf, int(config["data"]["seq_len"]))
        if gap > 1e-4:
            raise RuntimeError(f"the exported model's logits differ from poslab's by {gap:.3g}")
        os.replace(staging, out)  # onto an empty folder too (rename(2) replaces one)
    except Exception as err:
        code = no_room_errno(err)
        if code is None:
            raise
        raise DiskFull(
            f"no room to write the export to {out.parent} ({os.strerror(code)}"
            f"{': a file-size limit (ulimit -f)' if code == errno.EFBIG else ''}); nothing was "
            "written at --out; free some space and run again"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return hf, gap


def no_room_errno(err: BaseException) -> int | None:
    """The errno of a write that failed for lack of room (NO_SPACE_ERRNOS), else None. The
    safetensors writer reports it in its message only (`... (os error 28)`)."""
    if isinstance(err, OSError):
        return err.errno if err.errno in NO_SPACE_ERRNOS else None
    if type(err).__name__ == "SafetensorError":
        found = re.search(r"(?:os error |code: )(\d+)", str(err))
        code = int(found.group(1)) if found else None
        return code if code in NO_SPACE_ERRNOS else None
    return None


def check_exportable_tokenizer(tokenizer: Any, consequence: str = V1_EXPORT) -> None:
    """A version-1 word vocabulary whose <eos> (or <unk>) shares its id with a word
    (data/tokens.py TOKENIZER_VERSIONS) has no faithful HF tokenizer, and no end of text a
    generation can stop at (`consequence`, generate.py's): one line."""
    vocab = tokenizer.get_vocab()
    if len(set(vocab.values())) < len(vocab):  # two tokens at one id (read_tokenizer)
        raise ConfigError(
            "this run's word vocabulary is version 1 (data.tokenizer_version), whose <eos> "
            f"shares its id with a word: {consequence}"
        )


def run_tokenizer(
    ckpt: Path, config: dict[str, Any], data_path: str | None = None, option: str = "data_path="
) -> Any:
    """The `tokenizers` tokenizer a corpus run trained with: the one its checkpoint recorded,
    never one retrained on a corpus that changed since; for a checkpoint older than the record,
    the corpus's (`data_path` where it moved), checked against the run's vocabulary. A
    `data_path` (the command's `option`) that would not be read is one line, not ignored."""
    from poslab.data.cache import TokenCache, check_unrecorded_tokenizer
    from poslab.model.build import read_checkpoint

    record = read_checkpoint(ckpt).get("tokenizer")
    if record and data_path:
        raise ConfigError(
            f"{option}{data_path}: this run recorded its tokenizer, which is used whatever the "
            "corpus (the corpus is read only for runs older than that record); leave "
            f"{option.strip(' =')} out"
        )
    if record:
        from poslab.data.tokens import read_tokenizer

        return read_tokenizer(record["json"])
    overrides = {"path": data_path} if data_path else {}
    cache = TokenCache.from_config(config["data"], **overrides)
    check_unrecorded_tokenizer(cache, ckpt, asked=bool(data_path))
    return cache.tokenizer()


def logit_gap(model: GPT, hf: nn.Module, length: int) -> float:
    """The largest |logit| difference of poslab's model and the HF model on random tokens."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, length), generator=generator)
    with torch.inference_mode():
        return float((model(ids) - hf(input_ids=ids).logits).abs().max())


USAGE = """A poslab run as a standard Hugging Face model (save_pretrained: config, weights,
tokenizer), for the tools people already run on HF models (lm-evaluation-harness, RULER, vLLM).

poslab-export outputs/runs/DATE/TIME_NAME --out exported/rope   # or python scripts/export_hf.py
lm_eval --model hf --model_args pretrained=exported/rope --tasks lambada_openai
lm_eval --model hf --model_args pretrained=exported/alibi,trust_remote_code=True --tasks ...

Where the architecture maps exactly, a native HF model: pos=learned -> GPT-2, pos=rope ->
GPT-NeoX (either pairing). Every other run (any scheme, kernel, gate or sinks) exports with
poslab's model code in the folder (custom code: load it with trust_remote_code=True; it needs
torch and transformers, not poslab); --custom-code asks for that form for learned and rope too.
The export is checked before it is kept: the HF model, loaded back from the folder, must give
poslab's logits on a probe. It is written beside --out (.NAME.PID.partial) and renamed to --out
once checked: a stopped export leaves no --out. A task run (no text tokenizer), a run folder
without a checkpoint, an --out that holds files or that another export is writing, a full disk,
a --data-path that is no folder or that the run would not read (it recorded its tokenizer):
one `error: ...` line with exit code 2, nothing written at --out.
"""


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/export_hf.py", description=USAGE)
    parser.add_argument("run", type=a_path, help="a training run folder (or a .ckpt file)")
    parser.add_argument("--out", type=a_path, required=True, help="the HF model's folder (new)")
    parser.add_argument(
        "--data-path", type=a_path, default=None, help="the corpus, if it moved (tokenizer)"
    )
    parser.add_argument(
        "--custom-code",
        action="store_true",
        help="poslab's model code in the folder even where a native architecture maps exactly",
    )
    args = parser.parse_args(argv)
    args.run, args.out = Path(args.run), Path(args.out)
    require_extra("transformers", "hf", "scripts/export_hf.py")
    check_new_folder(args.out)
    check_writable(args.out, "--out")
    if args.data_path and not Path(args.data_path).is_dir():
        what = "is a file" if Path(args.data_path).exists() else "no such folder"
        raise ConfigError(f"--data-path {args.data_path}: {what}; pass the corpus folder")
    folder, architecture, gap = export_and_check(
        args.run, args.out, args.data_path, args.custom_code
    )
    trust = ", trust_remote_code=True" if "custom code" in architecture else ""
    print(
        f"wrote {folder} ({architecture}; logits equal poslab's within {gap:.1e}); "
        f"load it with AutoModelForCausalLM.from_pretrained({str(folder)!r}{trust})",
        flush=True,
    )


if __name__ == "__main__":
    main()

"""A poslab run as a standard Hugging Face model (save_pretrained: config, weights, tokenizer),
for the tools people already run on HF models (lm-evaluation-harness, RULER, vLLM, ...).

python scripts/export_hf.py outputs/runs/DATE/TIME_NAME --out exported/rope
lm_eval --model hf --model_args pretrained=exported/rope --tasks lambada_openai

Exports where the architecture maps exactly (poslab/hf/export.py): pos=learned -> GPT-2, pos=rope ->
GPT-NeoX (either pairing). The export is checked before it is kept: the HF model, loaded back
from the folder, must give poslab's logits on a probe. Another scheme, a run folder without a
checkpoint, an --out that holds files: one `error: ...` line with exit code 2, nothing written.
"""

from __future__ import annotations

from pathlib import Path

from poslab.arguments import OneLineParser, check_writable
from poslab.errors import ConfigError, exit_on_config_error


@exit_on_config_error
def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="scripts/export_hf.py", description=__doc__)
    parser.add_argument("run", type=Path, help="a training run folder (or a .ckpt file)")
    parser.add_argument("--out", type=Path, required=True, help="the HF model's folder (new)")
    parser.add_argument("--data-path", default=None, help="the corpus, if it moved (tokenizer)")
    args = parser.parse_args(argv)
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise ConfigError(f"--out {args.out} is not an empty folder; pass a new folder")
    check_writable(args.out, "--out")
    from poslab.hf.export import export_and_check

    folder, architecture, gap = export_and_check(args.run, args.out, args.data_path)
    print(
        f"wrote {folder} ({architecture}; logits equal poslab's within {gap:.1e}); "
        f"load it with AutoModelForCausalLM.from_pretrained({str(folder)!r})",
        flush=True,
    )


if __name__ == "__main__":
    main()

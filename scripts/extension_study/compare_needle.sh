#!/usr/bin/env bash
# The needle part of the study (docs/results.md, "Context extension by fine-tuning"): every
# finished needle job folder under OUT in one table (run from the repository root; extra
# arguments go to compare.py, e.g. --out "$PWD/docs/results/extension_needle")
ROOT=$(pwd)
cd "${OUT:-outputs/extension_study}"
dirs=$(for d in nbase_s* neval0_* nft*_* nplain*_s* ndrope*_s*; do [ -f $d/extrapolation/extrapolation.json ] && echo $d; done)
R=()
for k in ntk llama3; do R+=(--rename "rope + $k s=4=rope + $k s=4, eval-time (0 steps)"); done
# rows that share a label differ in trainer.max_steps (and the parent in its whole recipe)
while IFS= read -r line; do R+=(--rename "$line"); done < <(python - $dirs <<'PY'
import sys
from pathlib import Path
from poslab.report.compare import label_rows
labels = {r["scheme"] for r in label_rows([Path(d) / "extrapolation" / "extrapolation.json" for d in sys.argv[1:]])}
for label in sorted(labels):
    steps = label.split("trainer.max_steps=")[1].split("]")[0].split(",")[0] if "max_steps=" in label else None
    if label.startswith("rope [") and "data.seq_len=64" in label:
        print(f"{label}=rope (the needle at L=64)")
    elif label.startswith("rope [") and steps:
        print(f"{label}=rope, {steps} steps at L=256 (no extension)")
    elif label.startswith("nope (DroPE") and steps:
        print(f"{label}=nope (DroPE from rope at L=64), {steps} steps")
    elif ", fine-tuned from L=64" in label and steps:
        print(f"{label}={label.split(', fine-tuned')[0]}, {steps} steps at L=256")
PY
)
python "$ROOT/scripts/compare.py" $dirs --baseline "rope (the needle at L=64)" "${R[@]}" "$@" \
  --title "the needle: rope trained at L=64 (tiny, 4 heads), extended to 256"

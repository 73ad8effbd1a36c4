#!/usr/bin/env bash
# The study's table from every finished job folder under OUT (run from the repository root;
# extra arguments go to compare.py, e.g. --out "$PWD/docs/results/extension_finetune": an
# absolute path, since this runs inside OUT). PREFIX=slide_ (or cuse_) tables the same rows'
# sliding-mode (context-use) evaluations instead (job.sh slide, cuse).
ROOT=$(pwd)
cd "${OUT:-outputs/extension_study}"
P=${PREFIX:-}
dirs=$(for d in ${P}base_s* ${P}eval0_* ${P}ft50_* ${P}ft200_* ${P}drope50_* ${P}drope200_* ${P}plain50_* ${P}plain200_* ${P}scratch512_*; do [ -f $d/extrapolation/extrapolation.json ] && echo $d; done)
R=()
# LongRoPE's factors are searched on each parent, so its seeds differ in them by design
PS=""; echo "$dirs" | grep -q longrope && PS="pos.scaling.long_factor pos.scaling.short_factor"
# the rows that share the name rope or DroPE's are told apart by long option lists: short names
while IFS= read -r line; do R+=(--rename "$line"); done < <(python - "$PS" $dirs <<'PY'
import sys
from pathlib import Path
from poslab.report.compare import label_rows
per_seed = sys.argv[1].split() if sys.argv[1] else None  # as compare.py is given below
files = [Path(d) / "extrapolation" / "extrapolation.json" for d in sys.argv[2:]]
labels = {r["scheme"] for r in label_rows(files, per_seed=per_seed)}
for label in sorted(labels):
    if label.startswith("rope + ") and label.endswith(" s=4"):  # an eval-time kind (0 steps)
        print(f"{label}={label}, eval-time (0 steps)")
    elif label.startswith("rope ["):
        if "data.seq_len=128" in label:
            print(f"{label}=rope")
        elif "trainer.max_steps=50," in label or "trainer.max_steps=50]" in label:
            print(f"{label}=rope, 50 steps at L=512 (no extension)")
        elif "trainer.max_steps=200" in label:
            print(f"{label}=rope, 200 steps at L=512 (no extension)")
        elif "trainer.max_steps=350" in label:
            print(f"{label}=rope from scratch at L=512 (350 steps)")
    elif label.endswith(", fine-tuned from L=128"):  # one step count: the first slice's 50
        print(f"{label}={label.split(', fine-tuned')[0]}, 50 steps at L=512")
    elif ", fine-tuned from L=128 [" in label and "max_steps=" in label:
        steps = label.split("trainer.max_steps=")[1].split("]")[0].split(",")[0]
        print(f"{label}={label.split(', fine-tuned')[0]}, {steps} steps at L=512")
    elif label.startswith("nope (DroPE") and "max_steps=" in label:
        steps = label.split("trainer.max_steps=")[1].split("]")[0].split(",")[0]
        print(f"{label}=nope (DroPE from rope at L=128), {steps} steps")
PY
)
python "$ROOT/scripts/compare.py" $dirs --baseline rope "${R[@]}" \
  $(for k in $PS; do echo --per-seed $k; done) "$@" \
  --title "context extension by fine-tuning: rope trained at L=128 (3M, 300 steps), extended to 512"

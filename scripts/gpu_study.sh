#!/usr/bin/env bash
# ../shared/GPU.md's order on a lent GPU machine, in two calls of the device tool (each a step
# with its own time limits), after `bash scripts/gpu_prepare.sh` here (carry .whl and .gpudata):
#   bash scripts/gpu_study.sh .gpudata/wikitext-2 "$OUT"             # 1. the paper_gpu study (~9 min)
#   STEP=bench bash scripts/gpu_study.sh .gpudata/wikitext-2 "$OUT"  # 2. speed, then the CUDA tests
# Step 1 runs `scripts/study.py paper_gpu` with --time-limit (STUDY_MINUTES, 8 by default): at the
# limit the running jobs save a checkpoint and the merged table of what finished is written. The
# study's files (every run's logs, status, evaluation; not its checkpoints) are copied into
# $OUT/paper_gpu/ every 20 s, so a call cut off by its own limit still brings back what finished.
# Tried on a CPU: REQUIRE_CUDA=0 STUDY_MINUTES=1 STUDY_ARGS='model=tiny ... --device cpu'.
set -u
CORPUS=${1:?usage: gpu_study.sh CORPUS OUT}
OUT=${2:?usage: gpu_study.sh CORPUS OUT}
STEP=${STEP:-study}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline
if [ -d /opt/torch/.venv/bin ]; then export PATH=/opt/torch/.venv/bin:$PATH; fi # its torch
if [ -d .whl ]; then
  python3 -m pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$PWD/src
fi
clock() { date +%s; }
began=$(clock)
note() { echo "[$(($(clock) - began))s] $*" | tee -a "$OUT/steps.txt"; }

{
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  python3 -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'
} >"$OUT/machine-$STEP.txt" 2>&1
cat "$OUT/machine-$STEP.txt"
note "imports"
if ! timeout "${IMPORT_LIMIT:-90}" python3 -c \
  "import torch, lightning, hydra, datasets, poslab.run.training, poslab.study.driver; assert torch.cuda.is_available() or '${REQUIRE_CUDA:-1}' == '0'" \
  >"$OUT/imports-$STEP.log" 2>&1; then
  tail -n 5 "$OUT/imports-$STEP.log"
  note "the imports failed or hung: stopping"
  exit 1
fi

copy_study() { # the study folder without checkpoints, W&B or caches
  python3 - "$1" "$2" <<'PY'
import shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("*.ckpt", "wandb", ".cache", ".submitit", "*.lock"))
PY
}

if [ "$STEP" = study ]; then
  STUDY=${STUDY_DIR:-/tmp/poslab-study}
  minutes=${STUDY_MINUTES:-8}
  note "study paper_gpu, --time-limit $minutes min"
  (while sleep 20; do [ -d "$STUDY" ] && copy_study "$STUDY" "$OUT/paper_gpu" 2>/dev/null; done) &
  syncer=$!
  timeout "$((minutes * 60 + 150))" python3 scripts/study.py paper_gpu data.path="$CORPUS" \
    logger=csv --out "$STUDY" --time-limit "$minutes" ${STUDY_ARGS:-} >"$OUT/study.log" 2>&1
  note "study rc=$?"
  kill "$syncer" 2>/dev/null
  copy_study "$STUDY" "$OUT/paper_gpu"
  tail -n 25 "$OUT/study.log"
  cat "$OUT/paper_gpu/study.md" 2>/dev/null | head -n 30
  exit 0
fi

# STEP=bench: speed alone on the GPU, every scheme, with and without compile; then the CUDA tests
note "benchmark --peer (every scheme)"
timeout "${BENCH_LIMIT:-240}" python3 scripts/benchmark.py --peer --device cuda \
  ${BENCH_SCHEMES:+--schemes $BENCH_SCHEMES} --out "$OUT/benchmarks-gpu.md" >"$OUT/bench.log" 2>&1
note "benchmark rc=$?"
timeout "${COMPILE_LIMIT:-110}" python3 scripts/benchmark.py --compile --device cuda \
  --attention sdpa --schemes rope alibi t5 --rounds 2 --model medium --seq-len 512 \
  --out "$OUT/benchmarks-gpu-compile.md" >"$OUT/bench-compile.log" 2>&1
note "benchmark --compile rc=$?"
timeout "${TEST_LIMIT:-180}" python3 -m pytest tests/test_cuda.py \
  tests/study -m "not slow" -v --tb=short -n 6 -p no:cacheprovider -rfE >"$OUT/tests.log" 2>&1
note "tests rc=$? ($(tail -n 1 "$OUT/tests.log"))"
grep -E "(FAILED|ERROR) " "$OUT/tests.log" | cut -c1-240 | head -n 40
tail -n 3 "$OUT"/bench*.log

#!/usr/bin/env bash
# The GPU checklist in one command, for a CUDA machine with poslab's requirements installed:
#   bash scripts/gpu_checklist.sh CORPUS OUT
# 1. the CUDA tests (tests/test_cuda*.py: every kernel on every scheme it serves, fp32 and bf16;
#    a real run with precision auto, fused AdamW and clipping), alongside
# 2. the quick start on CUDA for rope, alibi, t5 and cope (attention=auto), then alibi and t5 on
#    compiled FlexAttention with trainer.compile=true (W&B left out: logger=csv);
# 3. scripts/benchmark.py --peer on the GPU (every scheme), then --compile for the bias schemes on
#    sdpa and on flex.
# Logs and report files land in OUT (runs.tar.gz holds each run's eval report and train.log).
# Each step has its own time limit, so one that hangs costs only its own share.
set -u
CORPUS=${1:?usage: gpu_checklist.sh CORPUS OUT}
OUT=${2:?usage: gpu_checklist.sh CORPUS OUT}
RUNS=${RUNS:-/tmp/poslab-gpu-runs}
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."

clock() { date +%s; }
began=$(clock)
note() { echo "[$(($(clock) - began))s] $*"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python -c "import torch, lightning; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'lightning', lightning.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# the imports first, under a short limit: on one machine an import hung until the whole call's
# limit ran out and nothing came back (run this script's first minute as a call of its own)
note "imports"
if ! timeout "${IMPORT_LIMIT:-90}" python -X importtime -c \
  "import torch, lightning, hydra, datasets, poslab.run.training; assert torch.cuda.is_available()" \
  2>"$OUT/imports.log"; then
  tail -n 5 "$OUT/imports.log"
  note "the imports failed or hung: stopping"
  exit 1
fi

# 1 and 2 share the GPU (tokens/s of the quick starts are therefore not a speed measurement:
# the benchmark below is)
note "tests + quick starts"
timeout "${TEST_LIMIT:-220}" python -m pytest tests/test_cuda.py \
  -v --tb=short -n 6 -p no:cacheprovider -rfE >"$OUT/tests.log" 2>&1 &
tests=$!
quick() {  # name, overrides...
  local name=$1
  shift
  timeout "${RUN_LIMIT:-220}" python train.py experiment=quickstart data.path="$CORPUS" logger=csv \
    hydra.run.dir="$RUNS/$name" "$@" >"$RUNS/$name.console" 2>&1
  echo "$name rc=$?" >>"$RUNS/status.txt"
}
export OMP_NUM_THREADS=2 # six processes share 16 cores
pids=()
for scheme in rope alibi t5 cope; do
  quick "$scheme" pos="$scheme" &
  pids+=($!)
done
quick alibi_flex_compiled pos=alibi attention=flex trainer.compile=true &
pids+=($!)
quick t5_flex_compiled pos=t5 attention=flex trainer.compile=true &
pids+=($!)
wait "${pids[@]}"
unset OMP_NUM_THREADS
note "quick starts done: $(tr '\n' ' ' <"$RUNS/status.txt")"
wait "$tests"
note "tests rc=$? ($(tail -n 1 "$OUT/tests.log"))"
# -v: each test's verdict is on its own line as it ends, so a run cut by its limit still names
# what failed (the first GPU run's summary never came: it was cut at 97%)
grep -E "(FAILED|ERROR) " "$OUT/tests.log" | cut -c1-240 | head -n 40
grep -hE "step [0-9]+/|ppl" "$RUNS"/*.console | tail -n 40 >"$OUT/quick_starts.txt"
tar -czf "$OUT/runs.tar.gz" -C "$RUNS" --exclude='*.ckpt' --exclude='*.cache*' .

# 3. speed, alone on the GPU
note "benchmark --peer (every scheme)"
# BENCH_SCHEMES: a subset where the lease is short (default: every scheme); COMPILE_KERNELS and
# COMPILE_ARGS (e.g. --model alibi_paper --seq-len 512) shape the compiled runs below
timeout "${BENCH_LIMIT:-240}" python scripts/benchmark.py --peer --device cuda \
  ${BENCH_SCHEMES:+--schemes $BENCH_SCHEMES} --out "$OUT/benchmarks-gpu.md" >"$OUT/bench.log" 2>&1
note "benchmark rc=$?"
for attention in ${COMPILE_KERNELS:-sdpa flex}; do
  note "benchmark --compile, attention=$attention"
  timeout "${COMPILE_LIMIT:-110}" python scripts/benchmark.py --compile --device cuda \
    --attention "$attention" --schemes rope alibi t5 kerple fire --rounds 2 ${COMPILE_ARGS:-} \
    --out "$OUT/benchmarks-gpu-compile-$attention.md" >"$OUT/bench-compile-$attention.log" 2>&1
  note "rc=$?"
done
tail -n 3 "$OUT"/bench*.log
# the reports stay files of their own; the logs travel as one archive
(cd "$OUT" && tar -czf logs.tar.gz --remove-files ./*.log quick_starts.txt)
note "done"

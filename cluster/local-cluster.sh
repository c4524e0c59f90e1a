#!/usr/bin/env bash
# A two-node Ray cluster on one machine, for trying --address and GPU packing without a real cluster:
#   cluster/local-cluster.sh start [FAKE_GPUS]   # head (CPU only) + a worker node advertising FAKE_GPUS GPUs
#   RAY_AUTH_MODE=token freezesweep launch SPEC --address 127.0.0.1:6380
#   cluster/local-cluster.sh stop                # stops this cluster's nodes only
# Fake GPUs are a scheduling label: trials are packed by gpus_per_trial but run on the CPU.
# Both nodes live in one folder of their own (RAY_CLUSTER_DIR, default /tmp/freezesweep-ray-UID-PORT,
# short: Ray's socket paths under it must fit in 107 bytes). `stop` ends only the processes whose
# command line names that folder: `ray stop` has no such option and would end every Ray on the machine.
set -euo pipefail
PORT=${RAY_PORT:-6380}
DIR=${RAY_CLUSTER_DIR:-/tmp/freezesweep-ray-$(id -u)-$PORT}
DIR=${DIR%/}
GRACE_S=${RAY_STOP_GRACE_S:-16}  # as `ray stop --grace-period`
export RAY_AUTH_MODE=token

# This cluster's processes named NAME (every one of them for ""). pgrep -f matches the whole command
# line; the raylet, GCS, dashboard and agents all carry the session folder under DIR/ in theirs (the
# slash: the cluster of port 638 is not the one of port 6380).
ours() { pgrep -f -- "$1.*$DIR/" || true; }

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

stop() {
  # In `ray stop`'s order (ray/scripts/scripts.py): raylets first (their workers exit with them),
  # then the other processes, the GCS last.
  mapfile -t raylets < <(ours raylet)
  end "${raylets[@]}"
  mapfile -t others < <(ours "" | grep -vxFf <(ours gcs_server) || true)
  end "${others[@]}"
  mapfile -t gcs < <(ours gcs_server)
  end "${gcs[@]}"
  echo "stopped the Ray cluster in $DIR"
}

case "${1:-}" in
  start)
    mkdir -p "$DIR"
    ray start --head --port "$PORT" --temp-dir "$DIR" --num-cpus 1 --num-gpus 0 --include-dashboard false \
      --disable-usage-stats
    ray start --address "127.0.0.1:$PORT" --temp-dir "$DIR" --num-cpus 2 --num-gpus "${2:-1}" --disable-usage-stats
    echo "cluster up: RAY_AUTH_MODE=token freezesweep launch SPEC --address 127.0.0.1:$PORT"
    ;;
  stop)
    stop
    ;;
  *)
    echo "usage: $0 start [FAKE_GPUS] | stop" >&2
    exit 2
    ;;
esac

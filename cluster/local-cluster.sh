#!/usr/bin/env bash
# A two-node Ray cluster on one machine, for trying --address and GPU packing without a real cluster:
#   cluster/local-cluster.sh start [FAKE_GPUS]   # head (CPU only) + a worker node advertising FAKE_GPUS GPUs
#   RAY_AUTH_MODE=token freezesweep launch SPEC --address 127.0.0.1:6380
#   cluster/local-cluster.sh stop
# Fake GPUs are a scheduling label: trials are packed by gpus_per_trial but run on the CPU.
set -euo pipefail
PORT=${RAY_PORT:-6380}
export RAY_AUTH_MODE=token
case "${1:-}" in
  start)
    ray start --head --port "$PORT" --num-cpus 1 --num-gpus 0 --include-dashboard false --disable-usage-stats
    ray start --address "127.0.0.1:$PORT" --num-cpus 2 --num-gpus "${2:-1}" --disable-usage-stats
    echo "cluster up: RAY_AUTH_MODE=token freezesweep launch SPEC --address 127.0.0.1:$PORT"
    ;;
  stop)
    ray stop --force
    ;;
  *)
    echo "usage: $0 start [FAKE_GPUS] | stop" >&2
    exit 2
    ;;
esac

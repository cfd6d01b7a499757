#!/usr/bin/env bash
# Start the Ray head on the first node; then start_worker.sh on every other node, then submit.sh.
# Every node needs the same Python environment (verl 0.9.1 + this package installed, so that the
# verl.plugins entry point registers mrtpo in every Ray worker) and access to the model weights.
#   GPUS_PER_NODE=8 bash recipes/multinode/start_head.sh
set -xeuo pipefail

RAY_PORT=${RAY_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

# The dashboard listens on all interfaces because `ray job submit` talks to it over HTTP.
ray start --head \
    --port="${RAY_PORT}" \
    --dashboard-host=0.0.0.0 \
    --dashboard-port="${DASHBOARD_PORT}" \
    --num-gpus="${GPUS_PER_NODE}"

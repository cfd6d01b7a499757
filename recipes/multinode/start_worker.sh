#!/usr/bin/env bash
# Join a worker node to the Ray cluster started by start_head.sh (run on every other node).
#   HEAD_ADDRESS=10.0.0.1:6379 GPUS_PER_NODE=8 bash recipes/multinode/start_worker.sh
set -xeuo pipefail

HEAD_ADDRESS=${HEAD_ADDRESS:?set HEAD_ADDRESS to the head node as host:port, e.g. 10.0.0.1:6379}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

ray start \
    --address="${HEAD_ADDRESS}" \
    --num-gpus="${GPUS_PER_NODE}"

#!/usr/bin/env bash
# Submit one recipe as a Ray job to a running cluster (start_head.sh + start_worker.sh):
#   NNODES=2 bash recipes/multinode/submit.sh recipes/text_to_sql/run_qwen2_5_coder_7b.sh [hydra overrides...]
#   NNODES=2 ADV_ESTIMATOR=gdpo bash recipes/multinode/submit.sh recipes/<task>/run_<model>.sh
# The job's driver runs on the head node, not in this shell, so the recipe knobs set here (every
# `${VAR:-default}` name in recipes/) travel in the runtime env, and the repository is uploaded as
# its working dir. PRINT_ONLY=1 prints the `ray job submit` command instead of running it.
set -xeuo pipefail

RECIPE=${1:?usage: submit.sh recipes/<task>/run_<model>.sh [hydra overrides...]}
shift

RAY_ADDRESS=${RAY_ADDRESS:-http://127.0.0.1:8265}
export NNODES=${NNODES:-2}
export GPUS_PER_NODE=${GPUS_PER_NODE:-8}
# Further variables for the job, by name, e.g. FORWARD_ENV="HF_HOME WANDB_API_KEY".
FORWARD_ENV=${FORWARD_ENV:-}
PRINT_ONLY=${PRINT_ONLY:-0}

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RECIPE_IN_REPO=$(realpath --relative-to="${REPO_DIR}" "${RECIPE}")

# The knob names, read from the recipes themselves so that this list cannot fall behind them.
mapfile -t KNOBS < <(find "${REPO_DIR}/recipes" -name '*.sh' -not -path '*/multinode/*' -print0 |
    xargs -0 grep -ohE '\$\{[A-Z][A-Z0-9_]*:-' | sed -E 's/^\$\{//; s/:-$//' | sort -u)
read -r -a EXTRA <<<"${FORWARD_ENV}"

RUNTIME_ENV_JSON=$(python3 -c '
import json, os, sys
repo, names = sys.argv[1], sys.argv[2:]
env_vars = {name: os.environ[name] for name in names if name in os.environ}
excludes = [".git", ".venv", "**/__pycache__", "checkpoints", "outputs", "*.parquet"]
print(json.dumps({"working_dir": repo, "excludes": excludes, "env_vars": env_vars}))
' "${REPO_DIR}" "${KNOBS[@]}" "${EXTRA[@]}")

COMMAND=(ray job submit --address "${RAY_ADDRESS}" --runtime-env-json "${RUNTIME_ENV_JSON}" --
    bash "${RECIPE_IN_REPO}" "$@")

if [[ "${PRINT_ONLY}" == 1 ]]; then
    printf '%q ' "${COMMAND[@]}"
    echo
else
    "${COMMAND[@]}"
fi

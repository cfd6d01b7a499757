# Tool-calling task knobs (rewards: tool_format, tool_correctness). Sourced by the run_*.sh
# scripts next to it after their model knobs; then runs the shared command.
# Data: python recipes/data/prepare_tool_calling.py
# shellcheck shell=bash

TASK=tool_calling
DATA_DIR=${DATA_DIR:-${HOME}/data/mrtpo/${TASK}}
TRAIN_FILE=${TRAIN_FILE:-${DATA_DIR}/train.parquet}
VAL_FILE=${VAL_FILE:-${DATA_DIR}/test.parquet}

# reward_fns.dispatch.reward_keys(["tool_calling"])
REWARD_FAMILY=tool_calling
REWARD_KEYS=tool_format,tool_correctness

# ours: up to four JSON function docs in the prompt; calls with brief reasoning fit in 1k.
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
# ours: a small dataset (800 BFCL train prompts), so a smaller batch and more epochs (~120 steps).
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-32}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-10}

TASK_OVERRIDES=()

# shellcheck source=recipes/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

# Text-to-SQL task knobs (rewards: sql_format, sql_executability, sql_execution). Sourced by the
# run_*.sh scripts next to it after their model knobs; then runs the shared command.
# Data: python recipes/data/prepare_text_to_sql.py [--spider-dir DIR | --bird-dir DIR]
# shellcheck shell=bash

TASK=text_to_sql
DATA_DIR=${DATA_DIR:-${HOME}/data/mrtpo/${TASK}}
TRAIN_FILE=${TRAIN_FILE:-${DATA_DIR}/train.parquet}
VAL_FILE=${VAL_FILE:-${DATA_DIR}/test.parquet}

# reward_fns.dispatch.reward_keys(["text_to_sql"])
REWARD_FAMILY=text_to_sql
REWARD_KEYS=sql_format,sql_executability,sql_execution

# ours: a schema prompt is a few hundred to ~2k tokens; a query with brief reasoning fits in 1k.
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-2048}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
# ours: 128 prompts x 8 responses per step, two policy updates per step; ~200 steps on Spider train.
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-64}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-3}

TASK_OVERRIDES=()

# shellcheck source=recipes/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

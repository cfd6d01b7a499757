# Instruction-following task knobs (one reward per constraint slot: if_c0 .. if_c{N-1}). Sourced by
# the run_*.sh scripts next to it after their model knobs; then runs the shared command.
# Data: python recipes/data/prepare_instruction_following.py --max-constraints "${IF_MAX_CONSTRAINTS}"
# shellcheck shell=bash

TASK=instruction_following
DATA_DIR=${DATA_DIR:-${HOME}/data/mrtpo/${TASK}}
TRAIN_FILE=${TRAIN_FILE:-${DATA_DIR}/train.parquet}
VAL_FILE=${VAL_FILE:-${DATA_DIR}/test.parquet}

# Constraint slots: the most constraints of any prompt (packaged IFEval: 3); must match the data.
IF_MAX_CONSTRAINTS=${IF_MAX_CONSTRAINTS:-3}
# reward_fns.dispatch.reward_keys(["instruction_following"], max_constraints=N)
REWARD_FAMILY=instruction_following
REWARD_KEYS=$(seq -s, -f 'if_c%g' 0 $((IF_MAX_CONSTRAINTS - 1)))

# ours: prompts are short; answers such as "at least 300 words" need room.
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-1024}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-2048}
# ours: a small dataset (539 IFEval train prompts), so a smaller batch and more epochs (~80 steps).
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-64}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-32}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-10}

# The verifier needs the slot count too, so that its keys match mrtpo.reward_keys.
TASK_OVERRIDES=(
    "+reward.custom_reward_function.reward_kwargs.max_constraints=${IF_MAX_CONSTRAINTS}"
)

# shellcheck source=recipes/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

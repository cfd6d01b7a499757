#!/usr/bin/env bash
# Instruction following with Qwen/Qwen3-4B-Instruct-2507 (a paper setting).
#   bash recipes/instruction_following/run_qwen3_4b_instruct_2507.sh [hydra overrides...]                         # MRTPO
#   ADV_ESTIMATOR=gdpo bash recipes/instruction_following/run_qwen3_4b_instruct_2507.sh [hydra overrides...]      # GDPO baseline
#   ADV_ESTIMATOR=grpo bash recipes/instruction_following/run_qwen3_4b_instruct_2507.sh [hydra overrides...]      # GRPO baseline
# Baselines share every other setting; knobs: here, recipes/instruction_following/common.sh, recipes/common.sh.
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B-Instruct-2507}
# ours: one GPU per vLLM engine; micro-batches sized for 80 GB GPUs.
ROLLOUT_TP=${ROLLOUT_TP:-1}
PPO_MICRO_BATCH_PER_GPU=${PPO_MICRO_BATCH_PER_GPU:-8}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-16}

# shellcheck source=recipes/instruction_following/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

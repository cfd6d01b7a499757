#!/usr/bin/env bash
# Instruction following with Qwen/Qwen2.5-7B-Instruct (a paper setting).
#   bash recipes/instruction_following/run_qwen2_5_7b.sh [hydra overrides...]                         # MRTPO
#   ADV_ESTIMATOR=gdpo bash recipes/instruction_following/run_qwen2_5_7b.sh [hydra overrides...]      # GDPO baseline
#   ADV_ESTIMATOR=grpo bash recipes/instruction_following/run_qwen2_5_7b.sh [hydra overrides...]      # GRPO baseline
# Baselines share every other setting; knobs: here, recipes/instruction_following/common.sh, recipes/common.sh.
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-7B-Instruct}
# ours: 7B: vLLM tensor parallel 2 and smaller micro-batches on 80 GB GPUs.
ROLLOUT_TP=${ROLLOUT_TP:-2}
PPO_MICRO_BATCH_PER_GPU=${PPO_MICRO_BATCH_PER_GPU:-4}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-8}

# shellcheck source=recipes/instruction_following/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

#!/usr/bin/env bash
# Tool calling with Qwen/Qwen2.5-3B-Instruct (a paper setting).
#   bash recipes/tool_calling/run_qwen2_5_3b.sh [hydra overrides...]                         # MRTPO
#   ADV_ESTIMATOR=gdpo bash recipes/tool_calling/run_qwen2_5_3b.sh [hydra overrides...]      # GDPO baseline
#   ADV_ESTIMATOR=grpo bash recipes/tool_calling/run_qwen2_5_3b.sh [hydra overrides...]      # GRPO baseline
# Baselines share every other setting; knobs: here, recipes/tool_calling/common.sh, recipes/common.sh.
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-3B-Instruct}
# ours: one GPU per vLLM engine; micro-batches sized for 80 GB GPUs.
ROLLOUT_TP=${ROLLOUT_TP:-1}
PPO_MICRO_BATCH_PER_GPU=${PPO_MICRO_BATCH_PER_GPU:-8}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-16}

# shellcheck source=recipes/tool_calling/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

#!/usr/bin/env bash
# Text-to-SQL with Qwen/Qwen2.5-Coder-7B-Instruct (a paper setting).
#   bash recipes/text_to_sql/run_qwen2_5_coder_7b.sh [hydra overrides...]                         # MRTPO
#   ADV_ESTIMATOR=gdpo bash recipes/text_to_sql/run_qwen2_5_coder_7b.sh [hydra overrides...]      # GDPO baseline
#   ADV_ESTIMATOR=grpo bash recipes/text_to_sql/run_qwen2_5_coder_7b.sh [hydra overrides...]      # GRPO baseline
# Baselines share every other setting; knobs: here, recipes/text_to_sql/common.sh, recipes/common.sh.
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-Coder-7B-Instruct}
# ours: 7B: vLLM tensor parallel 2 and smaller micro-batches on 80 GB GPUs.
ROLLOUT_TP=${ROLLOUT_TP:-2}
PPO_MICRO_BATCH_PER_GPU=${PPO_MICRO_BATCH_PER_GPU:-4}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-8}

# shellcheck source=recipes/text_to_sql/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

#!/usr/bin/env bash
# Instruction following with Qwen/Qwen2.5-7B-Instruct on verl's asynchronous v1 trainers (pinned: verl 0.9.1); every other setting is run_qwen2_5_7b.sh's.
#   bash recipes/instruction_following/run_qwen2_5_7b_async.sh [hydra overrides...]                        # one node: mrtpo_colocate_async
#   ADV_ESTIMATOR=gdpo bash recipes/instruction_following/run_qwen2_5_7b_async.sh [hydra overrides...]     # GDPO baseline, same trainer
#   ADV_ESTIMATOR=grpo bash recipes/instruction_following/run_qwen2_5_7b_async.sh [hydra overrides...]     # GRPO baseline, same trainer
#   TRAINER_MODE=mrtpo_separate_async NNODES=2 ROLLOUT_NNODES=2 \
#       bash recipes/multinode/submit.sh recipes/instruction_following/run_qwen2_5_7b_async.sh           # multi-node: rollout on its own nodes
# Knobs of the mode: recipes/common.sh ("trainer mode").
set -xeuo pipefail

TRAINER_MODE=${TRAINER_MODE:-mrtpo_colocate_async}

# shellcheck source=recipes/instruction_following/run_qwen2_5_7b.sh
source "$(dirname "${BASH_SOURCE[0]}")/run_qwen2_5_7b.sh"

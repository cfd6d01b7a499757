#!/usr/bin/env bash
# Does it learn better? gdpo vs mrtpo (β = 0.5) vs mrtpo with shuffled relevance, on verl's trainer,
# same data order, seeds, rollout settings and learning rate; several seeds per arm; greedy held-out
# evaluation every few steps; report with a plot per reward (python -m benchmarks.learning).
#
#   bash recipes/learning/compare.sh                                  # CPU preset, the built demo task
#   TASK=if_pair bash recipes/learning/compare.sh                     # the other demo task
#   PRESET=gpu bash recipes/learning/compare.sh                       # one GPU, vLLM rollout, aimed at 8 min
#   PRESET=gpu ROLLOUT=sglang MODEL_PATH=/models/qwen bash recipes/learning/compare.sh
#   RECIPE=instruction_following DATA_DIR=~/data/mrtpo/instruction_following bash recipes/learning/compare.sh
#   SEEDS="0 1 2 3" ARMS="gdpo mrtpo" bash recipes/learning/compare.sh --steps 20
#   bash recipes/learning/compare.sh --dry-run                        # compose and check every arm; start nothing
#
# Knobs (environment; empty = the preset's value): PRESET (cpu | gpu | smoke), OUT_DIR, SEEDS, ARMS,
# TASK (demo task: if_start_end | if_pair; default: the preset's),
# RECIPE (text_to_sql | tool_calling | instruction_following; default: the demo task), DATA_DIR
# (the recipe's prepared train.parquet/test.parquet), REWARD_KEYS (a subset of the family's),
# MODEL_PATH (a local HF model folder; default: the embedded SmolLM2-135M-Instruct), ROLLOUT
# (gpu: vllm | sglang), LR, STEPS, REPORT. Further options of python -m benchmarks.learning
# (--help) go after the script's name. Running the same command again skips finished runs and
# resumes an interrupted one from verl's last checkpoint.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1

PRESET=${PRESET:-cpu}
ARGS=(--preset "${PRESET}")
[[ -n "${OUT_DIR:-}" ]] && ARGS+=(--out "${OUT_DIR}")
# shellcheck disable=SC2206  # word splitting of the lists is intended
[[ -n "${SEEDS:-}" ]] && ARGS+=(--seeds ${SEEDS})
# shellcheck disable=SC2206
[[ -n "${ARMS:-}" ]] && ARGS+=(--arms ${ARMS})
[[ -n "${TASK:-}" ]] && ARGS+=(--task "${TASK}")
[[ -n "${RECIPE:-}" ]] && ARGS+=(--recipe "${RECIPE}")
[[ -n "${DATA_DIR:-}" ]] && ARGS+=(--data-dir "${DATA_DIR}")
# shellcheck disable=SC2206
[[ -n "${REWARD_KEYS:-}" ]] && ARGS+=(--reward-keys ${REWARD_KEYS//,/ })
[[ -n "${MODEL_PATH:-}" ]] && ARGS+=(--model-path "${MODEL_PATH}")
[[ -n "${ROLLOUT:-}" ]] && ARGS+=(--rollout "${ROLLOUT}")
[[ -n "${LR:-}" ]] && ARGS+=(--lr "${LR}")
[[ -n "${STEPS:-}" ]] && ARGS+=(--steps "${STEPS}")
[[ -n "${REPORT:-}" ]] && ARGS+=(--report "${REPORT}")

PYTHON=${PYTHON:-python3}
[[ -x .venv/bin/python && "${PYTHON}" == python3 ]] && PYTHON=.venv/bin/python
exec "${PYTHON}" -m benchmarks.learning "${ARGS[@]}" "$@"

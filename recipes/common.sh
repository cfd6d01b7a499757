# Shared part of every MRTPO recipe (pinned: verl 0.9.1). Sourced last by recipes/<task>/common.sh,
# after the run script set its model knobs and the task file its task knobs; every knob below is
# `${VAR:-default}`, so an exported variable wins over every default.
#
# Hyperparameters: "paper" = the paper's Table 9; everything else is ours, chosen as a verl GRPO
# recipe would (verl's examples/grpo_trainer), and marked "ours".
# shellcheck shell=bash

# --- estimator: mrtpo, or the baselines gdpo / grpo on the same trainer and settings ---
ADV_ESTIMATOR=${ADV_ESTIMATOR:-mrtpo}

# --- cluster (multi-node: set NNODES; see recipes/multinode/) ---
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

# --- trainer mode: verl's v1 modes with the MRTPO advantage step (docs/design.md "Trainer modes") ---
# mrtpo_sync | mrtpo_colocate_async (one node: partial rollouts, weights pushed every step)
# | mrtpo_separate_async (rollout on its own ROLLOUT_NNODES x ROLLOUT_GPUS_PER_NODE, multi-node)
TRAINER_MODE=${TRAINER_MODE:-mrtpo_sync}
MAX_OFF_POLICY_THRESHOLD=${MAX_OFF_POLICY_THRESHOLD:-2}  # ours: async responses at most 2 weight versions old
ASYNC_WARMUP_BATCHES=${ASYNC_WARMUP_BATCHES:-1}         # verl's default prefetch window
ROLLOUT_NNODES=${ROLLOUT_NNODES:-${NNODES}}             # separate_async: the standalone rollout pool
ROLLOUT_GPUS_PER_NODE=${ROLLOUT_GPUS_PER_NODE:-${GPUS_PER_NODE}}
CHECKPOINT_ENGINE=${CHECKPOINT_ENGINE:-nccl}            # separate_async: verl refuses "naive" there

# --- MRTPO (paper: β = 0.5 with a 10-step smoothstep warm-up) ---
MRTPO_BETA=${MRTPO_BETA:-0.5}
MRTPO_WARMUP_STEPS=${MRTPO_WARMUP_STEPS:-10}
# ours: replay in the actor's processes on its FSDP2 model (no extra model copy); "dedicated" = own pool.
REPLAY_PLACEMENT=${REPLAY_PLACEMENT:-colocated}
ACTOR_STRATEGY=${ACTOR_STRATEGY:-fsdp2}  # the colocated replay needs fsdp2 (the ref follows the actor)

# --- optimiser (paper: AdamW, β1 = 0.9, β2 = 0.999; verl's default optimiser is AdamW) ---
ADAM_BETAS=${ADAM_BETAS:-[0.9,0.999]}
LR=${LR:-1e-6}                      # ours: verl's GRPO examples
WEIGHT_DECAY=${WEIGHT_DECAY:-0.01}  # ours: verl's default
KL_LOSS_COEF=${KL_LOSS_COEF:-0.001} # ours: low-variance KL loss to the reference, as verl's GRPO examples

# --- rollout (ours) ---
ROLLOUT_N=${ROLLOUT_N:-8}
ROLLOUT_TEMPERATURE=${ROLLOUT_TEMPERATURE:-1.0}
ROLLOUT_TP=${ROLLOUT_TP:-1}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.6}
PPO_MICRO_BATCH_PER_GPU=${PPO_MICRO_BATCH_PER_GPU:-8}
LOG_PROB_MICRO_BATCH_PER_GPU=${LOG_PROB_MICRO_BATCH_PER_GPU:-16}

# --- bookkeeping (ours) ---
MODEL_NAME=$(basename "${MODEL_PATH}" | tr '[:upper:].' '[:lower:]_')
PROJECT_NAME=${PROJECT_NAME:-mrtpo_${TASK}}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-${MODEL_NAME}_${ADV_ESTIMATOR}}
CKPTS_DIR=${CKPTS_DIR:-${HOME}/ckpts/${PROJECT_NAME}/${EXPERIMENT_NAME}}
LOGGER=${LOGGER:-[console]}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-50}

# verl's settings of the chosen mode (trainer.v1.<mode>); separate_async's rule:
# train_batch_size = parameter_sync_step x ppo_mini_batch_size (one weight sync per step).
MODE_OVERRIDES=()
case "${TRAINER_MODE}" in
mrtpo_sync) ;;
mrtpo_colocate_async)
    MODE_OVERRIDES=(
        trainer.v1.colocate_async.num_warmup_batches="${ASYNC_WARMUP_BATCHES}"
        trainer.v1.sampler.max_off_policy_threshold="${MAX_OFF_POLICY_THRESHOLD}"
    )
    ;;
mrtpo_separate_async)
    PARAMETER_SYNC_STEP=${PARAMETER_SYNC_STEP:-$((TRAIN_BATCH_SIZE / PPO_MINI_BATCH_SIZE))}
    MODE_OVERRIDES=(
        trainer.v1.separate_async.num_warmup_batches="${ASYNC_WARMUP_BATCHES}"
        trainer.v1.separate_async.parameter_sync_step="${PARAMETER_SYNC_STEP}"
        trainer.v1.sampler.max_off_policy_threshold="${MAX_OFF_POLICY_THRESHOLD}"
        actor_rollout_ref.rollout.nnodes="${ROLLOUT_NNODES}"
        actor_rollout_ref.rollout.n_gpus_per_node="${ROLLOUT_GPUS_PER_NODE}"
        actor_rollout_ref.rollout.checkpoint_engine.backend="${CHECKPOINT_ENGINE}"
    )
    ;;
*)
    echo "TRAINER_MODE: ${TRAINER_MODE} (allowed: mrtpo_sync | mrtpo_colocate_async | mrtpo_separate_async)" >&2
    exit 2
    ;;
esac

# One verifier-information key per reward key: "a,b" -> "a_info,b_info" (reward_fns.dispatch.info_key).
VERIFIER_INFO_KEYS="${REWARD_KEYS//,/_info,}_info"

# Our entry point composes verl's ppo_trainer + the mrtpo block (mrtpo_verl/configs/mrtpo_trainer.yaml),
# validates it, then runs verl's main. trainer.v1.trainer_mode is ours for all three estimators,
# so the baselines run on the same trainer path as MRTPO.
python3 -m mrtpo_verl.main_ppo \
    algorithm.adv_estimator="${ADV_ESTIMATOR}" \
    algorithm.use_kl_in_reward=False \
    data.train_files="${TRAIN_FILE}" \
    data.val_files="${VAL_FILE}" \
    data.train_batch_size="${TRAIN_BATCH_SIZE}" \
    data.max_prompt_length="${MAX_PROMPT_LENGTH}" \
    data.max_response_length="${MAX_RESPONSE_LENGTH}" \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.strategy="${ACTOR_STRATEGY}" \
    actor_rollout_ref.actor.optim.lr="${LR}" \
    actor_rollout_ref.actor.optim.betas="${ADAM_BETAS}" \
    actor_rollout_ref.actor.optim.weight_decay="${WEIGHT_DECAY}" \
    actor_rollout_ref.actor.ppo_mini_batch_size="${PPO_MINI_BATCH_SIZE}" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="${PPO_MICRO_BATCH_PER_GPU}" \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef="${KL_LOSS_COEF}" \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n="${ROLLOUT_N}" \
    actor_rollout_ref.rollout.temperature="${ROLLOUT_TEMPERATURE}" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="${ROLLOUT_TP}" \
    actor_rollout_ref.rollout.gpu_memory_utilization="${GPU_MEMORY_UTILIZATION}" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="${LOG_PROB_MICRO_BATCH_PER_GPU}" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="${LOG_PROB_MICRO_BATCH_PER_GPU}" \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    reward.custom_reward_function.path=pkg://reward_fns.dispatch \
    reward.custom_reward_function.name=compute_score \
    "+reward.custom_reward_function.reward_kwargs.families=[${REWARD_FAMILY}]" \
    "mrtpo.reward_keys=[${REWARD_KEYS}]" \
    "mrtpo.verifier_info_keys=[${VERIFIER_INFO_KEYS}]" \
    mrtpo.beta="${MRTPO_BETA}" \
    mrtpo.warmup_steps="${MRTPO_WARMUP_STEPS}" \
    mrtpo.replay.placement="${REPLAY_PLACEMENT}" \
    trainer.logger="${LOGGER}" \
    trainer.project_name="${PROJECT_NAME}" \
    trainer.experiment_name="${EXPERIMENT_NAME}" \
    trainer.default_local_dir="${CKPTS_DIR}" \
    trainer.nnodes="${NNODES}" \
    trainer.n_gpus_per_node="${GPUS_PER_NODE}" \
    trainer.total_epochs="${TOTAL_EPOCHS}" \
    trainer.test_freq="${TEST_FREQ}" \
    trainer.save_freq="${SAVE_FREQ}" \
    trainer.critic_warmup=0 \
    trainer.v1.trainer_mode="${TRAINER_MODE}" \
    "${MODE_OVERRIDES[@]}" \
    "${TASK_OVERRIDES[@]}" \
    "$@"

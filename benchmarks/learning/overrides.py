"""The hydra overrides of one (arm, seed) run: everything but the arm's own lines is shared.

Shared by every arm of a seed: the data (and ``data.seed``, which fixes verl's shuffled data order),
the rollout settings and ``actor_rollout_ref.rollout.seed`` (the sampler's seed), the optimiser and
learning rate, the PPO batch sizes, KL settings, evaluation and checkpointing. Evaluation is greedy:
``val_kwargs`` temperature 0 with one response per prompt (``do_sample=false``), so an evaluation
measures the policy, not the sampler's luck. On the CPU backend verl's ``full_determinism`` is on
(:func:`determinism_overrides`): the ``hf`` rollout seeds each request by its index in the step's batch,
so every arm samples the same responses at step 1 (same initial weights), and a re-run of a seed
repeats its curves; arms then differ only through their updates.

CPU: verl's trainer on :mod:`mrtpo_cpu` (:func:`mrtpo_cpu.launch.cpu_overrides`:
FSDP2 on gloo in fp32, the ``hf`` rollout). GPU: one node of ``n_gpus`` GPUs with verl's vLLM or
SGLang rollout, colocated with the FSDP2 actor, as in ``recipes/common.sh``.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.learning.arms import arm_overrides
from benchmarks.learning.presets import Preset
from benchmarks.learning.tasks import Task

__all__ = ["GPU_ROLLOUTS", "run_env", "run_overrides"]

GPU_ROLLOUTS = ("vllm", "sglang")
LOCAL_RAY = {"RAY_ADDRESS": "local"}


def shared_overrides(preset: Preset, task: Task, seed: int) -> list[str]:
    """Settings every arm shares (after the device's base overrides)."""
    kl = (
        [
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"actor_rollout_ref.actor.kl_loss_coef={preset.kl_coef}",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        ]
        if preset.kl_coef > 0
        else ["actor_rollout_ref.actor.use_kl_loss=false"]
    )
    return [
        *task.reward_overrides(),
        *determinism_overrides(preset),
        "algorithm.use_kl_in_reward=false",
        *kl,
        f"actor_rollout_ref.actor.optim.lr={preset.lr}",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.rollout.n={preset.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        # greedy evaluation, one response per held-out prompt
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        "actor_rollout_ref.rollout.val_kwargs.n=1",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        "data.shuffle=true",
        f"mrtpo.warmup_steps={preset.warmup_steps}",
        f"mrtpo.shuffle_seed={seed}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=true",
        f"trainer.test_freq={preset.test_freq}",
        f"trainer.save_freq={preset.save_freq}",
        "trainer.max_actor_ckpt_to_keep=1",
        f"trainer.total_training_steps={preset.steps}",
        "trainer.project_name=mrtpo_learning",
        *preset.extra,
    ]


def determinism_overrides(preset: Preset) -> list[str]:
    """verl's ``full_determinism`` for the CPU ``hf`` rollout and the actor: a re-run gives the same curves.

    With it the ``hf`` server samples each request from its own seed (the sample's index in the step,
    the weights loaded so far, ``rollout.seed``) instead of one stream in arrival order, and verl's
    engine turns on torch's deterministic algorithms. Not set for vLLM/SGLang: verl then gives every
    request of a replica the same sampling seed, and a group of ``n`` identical prompts would sample
    ``n`` identical responses.
    """
    if preset.rollout != "hf":
        return []
    return [
        "actor_rollout_ref.rollout.full_determinism=true",
        "actor_rollout_ref.actor.fsdp_config.full_determinism=true",
    ]


def gpu_base_overrides(preset: Preset, task: Task, model_path: Path, ckpt_dir: Path) -> list[str]:
    """One GPU node, FSDP2 actor, verl's GPU rollout engine colocated with it."""
    micro = min(preset.batch_size * preset.n, 64)
    return [
        "trainer.device=cuda",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        "trainer.total_epochs=1000",
        "trainer.critic_warmup=0",
        f"trainer.default_local_dir={ckpt_dir}",
        f"data.train_files={task.train_file}",
        f"data.val_files={task.val_file}",
        f"data.train_batch_size={preset.batch_size}",
        f"data.max_prompt_length={task.prompt_length}",
        f"data.max_response_length={preset.response_length}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={preset.batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.name={preset.rollout}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={preset.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
    ]


def run_overrides(preset: Preset, task: Task, model_path: Path, folder: Path, arm: str, seed: int) -> list[str]:
    """Every override of the (arm, seed) run whose folder is ``folder`` (checkpoints in ``folder/ckpt``)."""
    ckpt = folder / "ckpt"
    if preset.device == "cpu":
        from mrtpo_cpu.launch import cpu_overrides

        if preset.rollout != "hf":
            raise ValueError(f"rollout {preset.rollout!r} on cpu: the CPU backend's rollout is 'hf'")
        base = cpu_overrides(
            model_path=model_path,
            train_files=task.train_file,
            val_files=task.val_file,
            ckpt_dir=ckpt,
            prompt_length=task.prompt_length,
            response_length=preset.response_length,
            batch_size=preset.batch_size,
            n=preset.n,
            total_steps=preset.steps,
        )
    elif preset.device == "gpu":
        if preset.rollout not in GPU_ROLLOUTS:
            raise ValueError(f"rollout {preset.rollout!r} on gpu: choose from {list(GPU_ROLLOUTS)}")
        base = gpu_base_overrides(preset, task, model_path, ckpt)
    else:
        raise ValueError(f"device {preset.device!r}: choose cpu or gpu")
    return [
        *base,
        *shared_overrides(preset, task, seed),
        f"trainer.experiment_name={arm}_seed{seed}",
        *arm_overrides(arm),
    ]


def run_env(preset: Preset) -> dict[str, str]:
    """The trainer process's environment additions: the CPU backend's, or offline hub access on GPU.

    ``RAY_ADDRESS=local``: every run starts its own Ray cluster. Without it, verl's ``ray.init()``
    joins the cluster last started by ``ray start`` on the machine (Ray reads
    ``/tmp/ray/ray_current_cluster``), and then refuses the run's ``num_cpus``/``num_gpus``.

    On CPU, Ray's memory monitor is off: it kills a cluster's workers when the *machine's* memory use
    passes 95%, so on a shared machine other processes' memory can stop a run's rollout workers and the
    run then waits for them until its time limit. The kernel's OOM killer still guards the machine.
    """
    if preset.device == "cpu":
        from mrtpo_cpu.launch import CPU_ENV, RUN_ENV

        return {**CPU_ENV, **RUN_ENV}  # RUN_ENV holds RAY_ADDRESS=local and the memory monitor's switch
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **LOCAL_RAY}

"""What a CPU run of verl's real trainer needs: a small HF model folder, the env, and config deltas.

- :func:`save_derived_model`: the embedded SmolLM2-135M-Instruct (dequantised), optionally cut to
  its first ``num_layers`` decoder layers, saved as a normal HF folder for
  ``actor_rollout_ref.model.path``.
- :data:`CPU_ENV`: set in the driver *before* verl is imported and forwarded to every Ray process
  (``ray_kwargs.ray_init.runtime_env.env_vars``): selects the CPU platform, puts this backend's folder on
  ``PYTHONPATH`` and makes every ``import verl`` import :mod:`mrtpo_cpu.register` (verl's
  ``VERL_USE_EXTERNAL_MODULES``).
- :func:`cpu_overrides`: the hydra overrides of a CPU run (logical GPUs for Ray's placement
  groups, the ``hf`` rollout, fp32 FSDP, small batches, one agent/reward worker).
- :func:`reward_overrides`: our ``reward_fns`` as verl's custom reward function, with the reward
  keys and verifier-information keys MRTPO reads.
- :func:`run_main_ppo`: one ``python -m mrtpo_verl.main_ppo`` run in a subprocess, its log and
  its file-logged metrics by step (shared by tests/cpu_run and ``benchmarks.step_overhead``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mrtpo_cpu.distributed import SETUP_HOOK
from mrtpo_verl.config import CPU_REPLAY_BUDGETS

__all__ = [
    "CPU_ENV",
    "RUN_ENV",
    "apply_cpu_env",
    "compose_actor_config",
    "cpu_overrides",
    "reward_overrides",
    "run_main_ppo",
    "save_derived_model",
    "separate_async_overrides",
]

#: The folder holding the ``mrtpo_cpu`` package (the repository root): the backend is not in the wheel, so every
#: process of a CPU run finds it through ``PYTHONPATH``.
BACKEND_ROOT = str(Path(__file__).resolve().parent.parent)

CPU_ENV = {
    "VERL_PLATFORM": "cpu",
    "PYTHONPATH": os.pathsep.join(p for p in (BACKEND_ROOT, os.environ.get("PYTHONPATH", "")) if p),
    # The CPU backend only: the plugin (verl.plugins entry point) registers the estimator and the mrtpo_<mode>
    # trainers itself, when verl's registry modules are imported (mrtpo_verl/plugin.py).
    "VERL_USE_EXTERNAL_MODULES": "mrtpo_cpu.register",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}


#: The driver's environment additions of a :func:`run_main_ppo` run. ``RAY_ADDRESS=local``: the run starts
#: its own Ray cluster, also beside another run, instead of joining the cluster last started by ``ray start``
#: (Ray reads ``/tmp/ray/ray_current_cluster``) and refusing the run's resources there. Ray's memory monitor
#: is off: it kills a cluster's workers when the *machine's* memory passes 95%, so another process's memory
#: could stop this run's workers; the kernel's OOM killer still guards the machine.
RUN_ENV = {"RAY_ADDRESS": "local", "RAY_memory_monitor_refresh_ms": "0"}


def apply_cpu_env() -> None:
    """Set :data:`CPU_ENV` in this process (call before the first ``import verl``)."""
    os.environ.update(CPU_ENV)


def save_derived_model(out_dir: str | Path, num_layers: int | None = 2) -> Path:
    """Save the embedded SmolLM2-135M-Instruct (first ``num_layers`` layers; None = all) to ``out_dir``."""
    import torch

    from mrtpo_verl.replay.model_loading import load_causal_lm

    out = Path(out_dir)
    model, tokenizer = load_causal_lm(None, dtype=torch.float32)
    if num_layers is not None and num_layers < model.config.num_hidden_layers:
        model.model.layers = model.model.layers[:num_layers]
        model.config.num_hidden_layers = num_layers
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = model.config.layer_types[:num_layers]
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def cpu_overrides(
    *,
    model_path: str | Path,
    train_files: str | Path,
    val_files: str | Path,
    ckpt_dir: str | Path,
    prompt_length: int,
    response_length: int,
    batch_size: int,
    n: int,
    total_steps: int,
    ray_cpus: int = 16,
    logical_gpus: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """Hydra overrides (on ``mrtpo_trainer``) that run verl's trainer on one CPU 'device'.

    ``logical_gpus``: Ray's GPU count (logical; see :mod:`mrtpo_cpu.platform`): one for
    the trainer's pool, plus one per standalone rollout replica in ``separate_async``
    (:func:`separate_async_overrides`).
    """
    env_vars = ",".join(f"{key}:'{value}'" for key, value in CPU_ENV.items())
    return [
        # Ray: logical GPU bundles (verl's resource pools ask for GPUs), enough logical CPUs.
        f"+ray_kwargs.ray_init.num_gpus={logical_gpus}",
        f"ray_kwargs.ray_init.num_cpus={ray_cpus}",
        "+ray_kwargs.ray_init.include_dashboard=false",
        f"+ray_kwargs.ray_init.runtime_env.env_vars={{{env_vars}}}",
        # gloo process group of each worker before verl's (whose backend string is invalid on CPU)
        f"+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook={SETUP_HOOK}",
        "trainer.device=cpu",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={total_steps}",
        "trainer.total_epochs=100",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={ckpt_dir}",
        "trainer.critic_warmup=0",
        # data
        f"data.train_files={train_files}",
        f"data.val_files={val_files}",
        f"data.train_batch_size={batch_size}",
        f"data.max_prompt_length={prompt_length}",
        f"data.max_response_length={response_length}",
        "data.dataloader_num_workers=0",
        "data.shuffle=true",
        # model + actor: FSDP2 in fp32 on gloo
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch_size * n}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
        # rollout: the hf backend of mrtpo_cpu
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch_size * n}",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.free_cache_engine=false",
        "actor_rollout_ref.rollout.enforce_eager=true",
        # replay: the CPU budgets per forward call (the package defaults are sized for a GPU)
        f"mrtpo.replay.micro_batch_size={CPU_REPLAY_BUDGETS[0]}",
        f"mrtpo.replay.max_tokens_per_micro_batch={CPU_REPLAY_BUDGETS[1]}",
        # reward loop: one worker
        "reward.num_workers=1",
        # TransferQueue: one storage unit (each is a Ray actor asking for a CPU)
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "transfer_queue.backend.SimpleStorage.total_storage_size=10000",
        *extra,
    ]


def compose_actor_config(model_dir: str | Path, ranks: int, options: Sequence[str] = ()) -> Any:
    """``actor_rollout_ref`` of a CPU run on ``ranks`` logical GPUs, for building verl's actor worker directly.

    ``options``: engine-option overrides (e.g. ``actor_rollout_ref.model.use_fused_kernels=true``); one that sets a
    field :func:`cpu_overrides` sets (e.g. the fp32 mixed precision) replaces it.
    """
    from hydra import compose, initialize_config_module

    model_dir = Path(model_dir)
    overrides = cpu_overrides(
        model_path=model_dir,
        train_files="unused.parquet",
        val_files="unused.parquet",
        ckpt_dir=model_dir.parent / "ckpt",
        prompt_length=128,
        response_length=32,
        batch_size=2,
        n=2,
        total_steps=1,
        extra=(f"trainer.n_gpus_per_node={ranks}",),
    )
    replaced = {option.lstrip("+").split("=", 1)[0] for option in options}
    overrides = [o for o in overrides if o.lstrip("+").split("=", 1)[0] not in replaced] + list(options)
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=overrides).actor_rollout_ref


def reward_overrides(families: Sequence[str], reward_keys: Sequence[str], info_keys: Sequence[str]) -> list[str]:
    """Hydra overrides that score with ``reward_fns.dispatch`` over ``families`` and name MRTPO's keys.

    ``reward_keys``: the per-reward scores (``mrtpo.reward_keys``); ``info_keys``: the verifier
    information of each, in the same order (``mrtpo.verifier_info_keys``).
    """
    if len(reward_keys) != len(info_keys):
        raise ValueError(f"reward_keys {list(reward_keys)} and info_keys {list(info_keys)} differ in length")
    return [
        "reward.custom_reward_function.path=pkg://reward_fns.dispatch",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.families=[{','.join(families)}]",
        f"mrtpo.reward_keys=[{','.join(reward_keys)}]",
        f"mrtpo.verifier_info_keys=[{','.join(info_keys)}]",
    ]


def separate_async_overrides(*, batch_size: int, n: int, parameter_sync_step: int) -> list[str]:
    """Overrides (after :func:`cpu_overrides` with ``logical_gpus=2``) for verl's ``separate_async`` on CPU.

    One standalone ``hf`` rollout replica on its own logical GPU bundle (``rollout.nnodes`` x
    ``n_gpus_per_node`` = 1), the actor's weights pushed to it by the ``gloo`` checkpoint engine
    (:mod:`mrtpo_cpu.gloo_checkpoint_engine`, loaded through verl's
    ``checkpoint_engine.custom_backend_module``), and ``parameter_sync_step`` mini-steps of
    ``batch_size / parameter_sync_step`` prompts (x ``n`` responses, one micro-batch) per step (verl's rule).
    """
    if batch_size % parameter_sync_step:
        raise ValueError(f"batch_size {batch_size} is not a multiple of parameter_sync_step {parameter_sync_step}")
    mini = batch_size // parameter_sync_step
    return [
        "trainer.v1.trainer_mode=mrtpo_separate_async",
        f"trainer.v1.separate_async.parameter_sync_step={parameter_sync_step}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={mini * n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={mini * n}",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=mrtpo_cpu.gloo_checkpoint_engine",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64",
    ]


def run_main_ppo(
    out_dir: Path, overrides: Sequence[str], timeout_s: float, env_extra: Mapping[str, str] | None = None
) -> dict:
    """Run ``python -m mrtpo_verl.main_ppo <overrides>`` in ``out_dir`` (created; must not exist).

    The run gets :data:`CPU_ENV` and verl's file logger (``out_dir/metrics.jsonl``); add
    ``trainer.logger=[console,file]`` to ``overrides`` to fill it. Returns ``{"dir", "returncode",
    "log", "metrics"}``, ``metrics`` being ``{step: {metric name: value}}``. A run past ``timeout_s``
    raises :class:`subprocess.TimeoutExpired` (a hang fails instead of blocking).
    """
    out_dir.mkdir()
    env = {
        **os.environ,
        **CPU_ENV,
        **RUN_ENV,
        "VERL_FILE_LOGGER_PATH": str(out_dir / "metrics.jsonl"),
        **(env_extra or {}),
    }
    log_path = out_dir / "log.txt"
    with log_path.open("w") as log:
        result = subprocess.run(
            [sys.executable, "-m", "mrtpo_verl.main_ppo", *overrides],
            env=env,
            cwd=out_dir,  # hydra writes its outputs/ folder into the working directory
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            check=False,
        )
    metrics: dict[int, dict] = {}
    if (out_dir / "metrics.jsonl").exists():
        for line in (out_dir / "metrics.jsonl").read_text().splitlines():
            entry = json.loads(line)
            metrics[int(entry["step"])] = entry["data"]
    return {
        "dir": out_dir,
        "returncode": result.returncode,
        "log": log_path.read_text(errors="replace"),
        "metrics": metrics,
    }

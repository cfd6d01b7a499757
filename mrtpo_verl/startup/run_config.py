"""Start-up checks of a whole run config, before Ray or any model starts."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError
from mrtpo_verl.startup.lengths import resolve_replay_settings
from mrtpo_verl.startup.reads import RunReads

__all__ = [
    "MULTI_REWARD_ESTIMATORS",
    "OUR_TRAINER_MODE",
    "REWARD_DISPATCH_PATH",
    "TRAINER_MODES",
    "known_reward_keys",
    "validate_run_config",
]

#: The v1 trainers registered by :mod:`mrtpo_verl.trainer.mrtpo_trainer` → the verl mode each extends.
TRAINER_MODES = {
    "mrtpo_sync": "sync",
    "mrtpo_colocate_async": "colocate_async",
    "mrtpo_separate_async": "separate_async",
}
#: The default (``mrtpo_trainer.yaml``).
OUR_TRAINER_MODE = "mrtpo_sync"
#: Why ``trainer.use_v1=false`` cannot run ``mrtpo`` (docs/design.md: "The legacy trainer").
LEGACY_TRAINER_REASON = (
    "verl 0.9.1's legacy RayPPOTrainer runs rollout, rewards, old log-probs, ref and the advantage inside "
    "one fit() method with no extension point before compute_advantage, and its compute_advantage hands a "
    "custom estimator neither the batch nor the step; the MRTPO replay stage and the estimator's inputs "
    "cannot be added without copying fit() or patching verl's module"
)
#: verl's custom-reward path of our verifiers.
REWARD_DISPATCH_PATH = "pkg://reward_fns.dispatch"
#: Estimators that need the reward components in the advantage step.
MULTI_REWARD_ESTIMATORS = ("mrtpo", "gdpo")


def known_reward_keys(config: DictConfig) -> list[str] | None:
    """Reward keys the configured reward function returns, when it is ours; else None (unknown)."""
    custom = OmegaConf.select(config, "reward.custom_reward_function", default=None) or {}
    if custom.get("path") != REWARD_DISPATCH_PATH:
        return None
    from reward_fns import dispatch

    kwargs: dict[str, Any] = dict(custom.get("reward_kwargs") or {})
    families = kwargs.get("families")
    return list(dispatch.reward_keys(list(families) if families is not None else None, kwargs.get("max_constraints")))


def validate_run_config(
    config: DictConfig, reads: RunReads | None = None, read_model: bool = True
) -> MRTPOConfig | None:
    """Validate the ``mrtpo`` block and its fit with verl's settings.

    Args:
        config: the whole run config.
        reads: the check's reads (the model config, for the replay's budget); a fresh one when None.
        read_model: False keeps an already set ``mrtpo.replay.max_context_tokens`` without reading the model
            config (see :func:`mrtpo_verl.startup.lengths.resolve_replay_settings`).

    Returns:
        The validated block when the run uses ``mrtpo`` or ``gdpo``; None for other estimators.

    Raises:
        MRTPOConfigError: naming the field, the problem and the allowed values.
    """
    _check_reward_kwargs(config)
    estimator = str(config.algorithm.adv_estimator)
    if estimator not in MULTI_REWARD_ESTIMATORS:
        return None
    mrtpo = MRTPOConfig.from_block(config.mrtpo, known_reward_keys=known_reward_keys(config))
    use_v1 = OmegaConf.select(config, "trainer.use_v1", default=True)
    if not use_v1 and estimator == "mrtpo":
        raise MRTPOConfigError(
            f"trainer.use_v1: false with adv_estimator=mrtpo (allowed: true, with trainer.v1.trainer_mode one of "
            f"{' | '.join(TRAINER_MODES)}); {LEGACY_TRAINER_REASON}. verl's own gdpo does run there"
        )
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode")
    if use_v1:
        _check_trainer_mode(config, str(mode), estimator)
    n = OmegaConf.select(config, "actor_rollout_ref.rollout.n")
    if n is not None and int(n) < 2:
        raise MRTPOConfigError(
            f"actor_rollout_ref.rollout.n: {n} with adv_estimator={estimator} (allowed: an integer ≥ 2); "
            "group-normalised rewards need at least two responses per prompt"
        )
    if estimator == "mrtpo" and mrtpo.replay.placement == "colocated":
        _check_colocated_actor(config)
    return resolve_replay_settings(config, mrtpo, reads, read_model) if estimator == "mrtpo" else mrtpo


#: The reward kwargs that set how every family of ours checks a response (reward_fns.process_pool.deadline).
_DEADLINE_KWARGS = ("timeout_s", "isolation", "sandbox_workers", "sandbox_memory_bytes")


def _check_reward_kwargs(config: DictConfig) -> None:
    """Our reward function's deadline and pool settings, checked before any worker starts.

    Without this a bad value surfaces only at the first reward call, inside a Ray reward worker.
    """
    custom = OmegaConf.select(config, "reward.custom_reward_function", default=None) or {}
    if custom.get("path") != REWARD_DISPATCH_PATH:
        return
    from reward_fns.process_pool.deadline import DeadlineSettings
    from reward_fns.total import RewardConfigError

    kwargs: dict[str, Any] = dict(custom.get("reward_kwargs") or {})
    field = "reward.custom_reward_function.reward_kwargs"
    if kwargs.get("isolation") == "inprocess":
        raise MRTPOConfigError(
            f"{field}.isolation: 'inprocess' (allowed: process); in-process checks have no deadline, so one hostile "
            "response can stall every step — it exists only for benchmarks.reward_throughput"
        )
    try:
        DeadlineSettings.from_kwargs(**{name: kwargs[name] for name in _DEADLINE_KWARGS if name in kwargs})
    except RewardConfigError as error:
        named = next((name for name in _DEADLINE_KWARGS if str(error).startswith(name)), "isolation")
        raise MRTPOConfigError(f"{field}.{named}: {error}") from error


def _check_trainer_mode(config: DictConfig, mode: str, estimator: str) -> None:
    """One of our registered modes, and what that mode needs from the rest of the config."""
    if mode not in TRAINER_MODES:
        ours = f"mrtpo_{mode}"
        hint = f"use {ours!r}: verl's {mode} with the MRTPO advantage step" if ours in TRAINER_MODES else ""
        raise MRTPOConfigError(
            f"trainer.v1.trainer_mode: {mode!r} with adv_estimator={estimator} (allowed: "
            f"{' | '.join(TRAINER_MODES)}); verl's own v1 trainers hand the advantage step no reward components"
            + (f" — {hint}" if hint else "")
        )
    if TRAINER_MODES[mode] != "separate_async":
        return
    block = f"trainer.v1.separate_async (trainer_mode={mode})"
    sync_steps = int(OmegaConf.select(config, "trainer.v1.separate_async.parameter_sync_step", default=1))
    batch = OmegaConf.select(config, "data.train_batch_size")
    mini = OmegaConf.select(config, "actor_rollout_ref.actor.ppo_mini_batch_size")
    if batch is not None and mini is not None and int(batch) != sync_steps * int(mini):
        raise MRTPOConfigError(
            f"{block}.parameter_sync_step: {sync_steps} with data.train_batch_size={batch} and "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} (allowed: train_batch_size = parameter_sync_step "
            "× ppo_mini_batch_size, verl's rule); each mini-step's advantage is then computed over "
            "train_batch_size / parameter_sync_step whole prompt groups"
        )
    backend = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine.backend")
    if backend == "naive":
        raise MRTPOConfigError(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend: 'naive' with trainer_mode={mode} (allowed: nccl, "
            "nixl, mooncake, …; verl's rule; on CPU: gloo, from mrtpo_cpu): the standalone rollout "
            "pool receives weights through a checkpoint engine"
        )
    # With mrtpo.replay.placement=colocated the replay runs on the trainer's pool (the actor's processes),
    # never on the standalone rollout pool, which holds no trainer weights (docs/design.md "Trainer modes").


def _check_colocated_actor(config: DictConfig) -> None:
    """The colocated replay runs on the actor engine's FSDP2 model: its options are checked one by one."""
    from mrtpo_verl.startup.engine import check_colocated_engine

    check_colocated_engine(config)

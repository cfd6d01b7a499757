"""Start-up checks of a whole run config, before Ray or any model starts."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError

__all__ = ["OUR_TRAINER_MODE", "REWARD_DISPATCH_PATH", "known_reward_keys", "validate_run_config"]

#: The v1 trainer registered by :mod:`mrtpo_verl.trainer.mrtpo_trainer`.
OUR_TRAINER_MODE = "mrtpo_sync"
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


def validate_run_config(config: DictConfig) -> MRTPOConfig | None:
    """Validate the ``mrtpo`` block and its fit with verl's settings.

    Returns:
        The validated block when the run uses ``mrtpo`` or ``gdpo``; None for other estimators.

    Raises:
        MRTPOConfigError: naming the field, the problem and the allowed values.
    """
    estimator = str(config.algorithm.adv_estimator)
    if estimator not in MULTI_REWARD_ESTIMATORS:
        return None
    mrtpo = MRTPOConfig.from_block(config.mrtpo, known_reward_keys=known_reward_keys(config))
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode")
    if OmegaConf.select(config, "trainer.use_v1") and mode != OUR_TRAINER_MODE:
        raise MRTPOConfigError(
            f"trainer.v1.trainer_mode: {mode!r} with adv_estimator={estimator} (allowed: {OUR_TRAINER_MODE}); "
            "verl's own v1 trainers hand the advantage step no reward components"
        )
    n = OmegaConf.select(config, "actor_rollout_ref.rollout.n")
    if n is not None and int(n) < 2:
        raise MRTPOConfigError(
            f"actor_rollout_ref.rollout.n: {n} with adv_estimator={estimator} (allowed: an integer ≥ 2); "
            "group-normalised rewards need at least two responses per prompt"
        )
    if estimator == "mrtpo" and mrtpo.replay.placement == "colocated":
        _check_colocated_actor(config)
    return mrtpo


#: Actor strategies whose engine the colocated replay can run in place.
COLOCATED_STRATEGIES = ("fsdp2",)


def _check_colocated_actor(config: DictConfig) -> None:
    """The colocated replay runs on the actor engine's FSDP2 model, without sequence parallelism."""
    strategy = OmegaConf.select(config, "actor_rollout_ref.actor.strategy")
    if strategy is not None and strategy not in COLOCATED_STRATEGIES:
        raise MRTPOConfigError(
            f"actor_rollout_ref.actor.strategy: {strategy!r} with mrtpo.replay.placement=colocated (allowed: "
            f"{' | '.join(COLOCATED_STRATEGIES)}); set actor_rollout_ref.actor.strategy=fsdp2, or "
            "mrtpo.replay.placement=dedicated"
        )
    sp = OmegaConf.select(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", default=1)
    if sp is not None and int(sp) > 1:
        raise MRTPOConfigError(
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size: {sp} with mrtpo.replay.placement=colocated "
            "(allowed: 1); the replay's forward passes do not split sequences — use mrtpo.replay.placement=dedicated"
        )

"""Start-up check of the actor engine's options against the colocated replay (one line per refusal).

The colocated replay (``mrtpo.replay.placement=colocated``) runs its forward passes on the actor engine's own
FSDP2 model (:class:`~mrtpo_verl.replay.model_runners.ShardedModelRunner`). What each engine option does to it:

- let through, not read here (docs/verification.md names the test, or the GPU row, of each): ``use_fused_kernels``
  (the replay replaces the root forward by the decoder's for its calls, so verl's fused log-prob forward never runs),
  ``use_remove_padding`` (the replay pads its own batches; verl's flash-attention patch passes padded batches
  through unchanged without sequence parallelism),
  ``enable_gradient_checkpointing`` (inactive in eval mode), ``param_offload`` / ``optimizer_offload`` /
  ``offload_policy`` (the replay runs inside the engine's ``eval_mode``, which loads offloaded parameters as
  verl's ``compute_log_prob`` does, and feeds inputs to the engine's compute device), ``use_torch_compile``
  (verl compiles only its entropy function, which the replay does not call), LoRA (the decoder's layers carry
  the adapters), ``model_dtype`` / mixed precision (the replay computes in float32 by default, on the stored
  weights; under the engine's autocast dtype only with ``mrtpo.replay.compute_dtype: model``);
- refused here, with the fix: a strategy other than ``fsdp2`` (Megatron, FSDP1) and Ulysses sequence
  parallelism (the replay's passes do not split sequences).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.config import MRTPOConfigError

__all__ = ["COLOCATED_STRATEGIES", "check_colocated_engine"]

#: Actor strategies whose engine the colocated replay can run in place.
COLOCATED_STRATEGIES = ("fsdp2",)
#: Where a user sets Ulysses sequence parallelism for the actor (verl reads the engine's; the actor's is deprecated).
ULYSSES_FIELDS = (
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
)
DEDICATED = "mrtpo.replay.placement=dedicated"


def check_colocated_engine(config: DictConfig) -> None:
    """Raise :class:`MRTPOConfigError` (one line: field, value, fix) for an actor engine the replay cannot share."""
    strategy = OmegaConf.select(config, "actor_rollout_ref.actor.strategy")
    if strategy is not None and strategy not in COLOCATED_STRATEGIES:
        why = (
            "Megatron's model is split by tensor/pipeline parallelism, which the replay's forward passes do not follow"
            if str(strategy).startswith("megatron")
            else "the replay runs FSDP2's sharded model in place"
        )
        raise MRTPOConfigError(
            f"actor_rollout_ref.actor.strategy: {strategy!r} with mrtpo.replay.placement=colocated (allowed: "
            f"{' | '.join(COLOCATED_STRATEGIES)}); {why} — set actor_rollout_ref.actor.strategy=fsdp2, or {DEDICATED}"
        )
    for field in ULYSSES_FIELDS:
        size = OmegaConf.select(config, field, default=1)
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise MRTPOConfigError(f"{field}: got {size!r} (allowed: an integer ≥ 1)")
        if size is not None and size > 1:
            raise MRTPOConfigError(
                f"{field}: {size} with mrtpo.replay.placement=colocated (allowed: 1); the replay's forward passes do "
                f"not split sequences over a sequence-parallel group — use {DEDICATED}"
            )

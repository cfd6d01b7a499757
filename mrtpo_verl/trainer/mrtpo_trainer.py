"""MRTPO on each of verl's v1 trainer modes: ``trainer.v1.trainer_mode=mrtpo_<verl mode>``.

=========================  =====================================  ==================================
registered name            verl trainer it extends                verl config block it reads
=========================  =====================================  ==================================
``mrtpo_sync``             ``PPOTrainerSync`` (``sync``)          ``trainer.v1.sync``
``mrtpo_colocate_async``   ``PPOTrainerColocateAsync``            ``trainer.v1.colocate_async``
``mrtpo_separate_async``   ``PPOTrainerSeparateAsync``            ``trainer.v1.separate_async``
=========================  =====================================  ==================================

Why one name per mode: verl's ``main_ppo`` picks the trainer class by ``trainer.v1.trainer_mode``
alone, and its registry refuses to re-register ``sync`` & co., so a single name cannot follow the
mode without patching verl's registry for every run in the process (GRPO runs included). The
``mrtpo_`` prefix reads in a recipe as "verl's <mode>, with MRTPO's advantage step"; the rest of
verl's configuration for that mode (``trainer.v1.<mode>``) is unchanged, because the classes report
verl's mode name to verl's base class (:class:`~mrtpo_verl.trainer.advantage_step.MRTPOStep`).
The advantage step itself is written once, in :mod:`mrtpo_verl.trainer.advantage_step`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from mrtpo_verl.compat.verl import pi_old_weights, rollout_bypass_mode
from mrtpo_verl.trainer.advantage_step import MRTPOStep

__all__ = ["TRAINER_CLASSES", "MRTPOColocateAsyncTrainer", "MRTPOSeparateAsyncTrainer", "MRTPOTrainer"]


@register_trainer("mrtpo_sync")
class MRTPOTrainer(MRTPOStep, PPOTrainerSync):
    """verl's ``sync`` v1 trainer with reward components in the advantage step and the MRTPO replay."""

    verl_mode = "sync"


@register_trainer("mrtpo_colocate_async")
class MRTPOColocateAsyncTrainer(MRTPOStep, PPOTrainerColocateAsync):
    """verl's ``colocate_async`` trainer (partial rollouts, weights pushed each step) with the MRTPO step."""

    verl_mode = "colocate_async"


@register_trainer("mrtpo_separate_async")
class MRTPOSeparateAsyncTrainer(MRTPOStep, PPOTrainerSeparateAsync):
    """verl's ``separate_async`` trainer (standalone rollout pool, ``parameter_sync_step`` mini-batches per sync).

    verl computes ``old_log_probs`` of mini-batch ``i ≥ 1`` of a sync cycle with the weights the cycle
    started from (π_old, parked on the CPU by ``DetachActorWorker.save_model_to_cpu(0)``), then puts
    the current weights back. The replay runs inside the same swap, so it scores with π_old too.
    """

    verl_mode = "separate_async"

    @contextlib.contextmanager
    def _replay_weights(self) -> Iterator[None]:
        if rollout_bypass_mode(self.config):
            # old_log_probs are the rollout's own, which no trainer weights reproduce: score with the current ones.
            yield
            return
        with pi_old_weights(self):
            yield


#: registered name → class; one entry per verl mode (checked against ``startup.TRAINER_MODES`` by the tests).
TRAINER_CLASSES: dict[str, type[MRTPOStep]] = {
    "mrtpo_sync": MRTPOTrainer,
    "mrtpo_colocate_async": MRTPOColocateAsyncTrainer,
    "mrtpo_separate_async": MRTPOSeparateAsyncTrainer,
}

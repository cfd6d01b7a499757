"""Which actor worker class each of verl's v1 trainer modes gets when MRTPO runs on it.

verl's ``sync`` and ``colocate_async`` trainers build the actor from ``ActorRolloutRefWorker``;
``separate_async`` swaps in ``DetachActorWorker`` (its subclass that can park weights on the CPU
for decoupled PPO over ``parameter_sync_step`` mini-batches). Our
:class:`~mrtpo_verl.workers.actor_worker.MRTPOActorRolloutRefWorker` adds the colocated replay and
the weight hand-out; for ``separate_async`` the two are combined by inheritance, so verl's own
save/restore methods and ours live on one worker.
"""

from __future__ import annotations

from typing import Any

from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.workers.engine_workers import ActorRolloutRefWorker

from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker

__all__ = ["MRTPODetachActorWorker", "mrtpo_actor_class"]


class MRTPODetachActorWorker(MRTPOActorRolloutRefWorker, DetachActorWorker):
    """verl's ``DetachActorWorker`` (``separate_async``) plus ``compute_mrtpo_relevance`` and ``mrtpo_state_dict``."""


#: verl's actor worker class → ours.
_OURS: dict[type, type] = {
    ActorRolloutRefWorker: MRTPOActorRolloutRefWorker,
    DetachActorWorker: MRTPODetachActorWorker,
}


def mrtpo_actor_class(verl_class: Any) -> type | None:
    """Our worker class for verl's ``verl_class``; None for classes that are not verl's actor workers."""
    return _OURS.get(verl_class) if isinstance(verl_class, type) else None

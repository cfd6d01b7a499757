"""verl's actor worker with one more method: hand its current full weights to a dedicated replay pool.

``MRTPOTrainer`` puts this class where verl's v1 trainer would put ``ActorRolloutRefWorker``
(``_init_resource_pool_mgr``), so everything verl does with the actor is unchanged; the dedicated
replay placement calls :meth:`mrtpo_state_dict` before each step so the replay scores the current
policy (the weights that produced ``old_log_probs``), not the initial one.
"""

from __future__ import annotations

from typing import Any

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

__all__ = ["MRTPOActorRolloutRefWorker"]


class MRTPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` plus :meth:`mrtpo_state_dict`."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mrtpo_state_dict(self) -> dict[str, Any] | None:
        """The full (HF-named) weights on CPU from rank 0; None from the other ranks.

        Every rank takes part because gathering FSDP shards is collective; only rank 0 keeps a copy,
        so a single full state dict crosses Ray.
        """
        per_tensor, _ = self.actor.engine.get_per_tensor_param()
        weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in per_tensor}
        return weights if self.rank == 0 else None

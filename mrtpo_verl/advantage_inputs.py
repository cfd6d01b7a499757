"""Hand the batch to the ``mrtpo`` estimator through verl's own ``compute_advantage``.

verl 0.9.1's ``compute_advantage`` (``verl/trainer/ppo/ray_trainer.py``) passes a registered
estimator only ``token_level_rewards``, ``response_mask``, ``config`` and ``index`` (plus
``non_tensor_batch``/``batch`` for the estimator named ``gdpo`` alone). MRTPO also needs the
per-reward scores, the relevance tensor, its own settings and the global step. Rather than copy
``compute_advantage``, the trainer stage opens this context around the stock call::

    with advantage_inputs(data, mrtpo_config, global_step) as inputs:
        data = compute_advantage(data, adv_estimator="mrtpo", ..., config=config.algorithm)
    metrics.update(inputs.metrics)

and the estimator reads what it needs from it (explicit keyword arguments win over the context).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mrtpo_verl.config import MRTPOConfig

__all__ = ["AdvantageInputs", "advantage_inputs", "current_advantage_inputs"]


@dataclass
class AdvantageInputs:
    """What the estimator needs beyond verl's stock kwargs.

    Attributes:
        non_tensor_batch: the DataProto's non_tensor_batch (reward components, verifier info, uid).
        batch: the DataProto's tensor batch (may hold ``mrtpo_relevance`` (bs, K, L)).
        mrtpo_config: the validated ``mrtpo`` block.
        global_step: the trainer's global step (drives the β warm-up).
        metrics: filled by the estimator with per-step figures for verl's tracking.
    """

    non_tensor_batch: Mapping[str, Any]
    batch: Mapping[str, Any]
    mrtpo_config: MRTPOConfig
    global_step: int
    metrics: dict[str, float] = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[AdvantageInputs | None] = contextvars.ContextVar(
    "mrtpo_advantage_inputs", default=None
)


@contextlib.contextmanager
def advantage_inputs(data: Any, mrtpo_config: MRTPOConfig, global_step: int) -> Iterator[AdvantageInputs]:
    """Make ``data`` (a verl ``DataProto``) visible to the estimator for the ``with`` block."""
    inputs = AdvantageInputs(
        non_tensor_batch=data.non_tensor_batch,
        batch=data.batch,
        mrtpo_config=mrtpo_config,
        global_step=global_step,
    )
    token = _CURRENT.set(inputs)
    try:
        yield inputs
    finally:
        _CURRENT.reset(token)


def current_advantage_inputs() -> AdvantageInputs | None:
    """The inputs of the innermost open :func:`advantage_inputs` block, if any."""
    return _CURRENT.get()

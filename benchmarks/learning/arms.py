"""The arms of the comparison: each is the same verl run with a different advantage estimator.

Every arm shares the data order, seeds, rollout settings, optimiser and trainer; only the hydra
overrides below differ. ``mrtpo_shuffle`` is the paper's control: MRTPO's relevance is shuffled
across tokens (``mrtpo.ablation=shuffle``), so the token weights keep their spread but lose their
placement; a gain of ``mrtpo`` over ``gdpo`` that ``mrtpo_shuffle`` also shows is not due to where
the credit lands.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ARMS", "DEFAULT_ARMS", "arm_overrides", "check_arms"]

ARMS: dict[str, tuple[str, ...]] = {
    "gdpo": ("algorithm.adv_estimator=gdpo",),
    "mrtpo": ("algorithm.adv_estimator=mrtpo", "mrtpo.beta=0.5", "mrtpo.ablation=none"),
    "mrtpo_shuffle": ("algorithm.adv_estimator=mrtpo", "mrtpo.beta=0.5", "mrtpo.ablation=shuffle"),
    # Not run by default: verl's GRPO on the verifier's scalar score, for a single-reward reference.
    "grpo": ("algorithm.adv_estimator=grpo",),
}
DEFAULT_ARMS = ("gdpo", "mrtpo", "mrtpo_shuffle")


def check_arms(names: Sequence[str]) -> tuple[str, ...]:
    """The arms in the given order; an unknown or repeated name raises ``ValueError`` naming it."""
    unknown = [name for name in names if name not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; choose from {list(ARMS)}")
    repeated = sorted({name for name in names if list(names).count(name) > 1})
    if repeated:
        raise ValueError(f"arm(s) {repeated} named more than once")
    if not names:
        raise ValueError(f"no arm given; choose from {list(ARMS)}")
    return tuple(names)


def arm_overrides(name: str) -> tuple[str, ...]:
    """The hydra overrides that make a run this arm."""
    return ARMS[check_arms([name])[0]]

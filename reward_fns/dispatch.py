"""One verl custom reward function for every task family, routed by ``data_source``.

verl's reward loop takes the list of extra keys from the *first* sample of a batch and reads the
same keys from every other sample, so every call returns the same key set whatever its task: the
union of the selected families' components. A component that does not belong to the sample's
family is 0.0 with an empty info string. All responses of one prompt (one group) share a family,
so such a filler is constant inside every group and can never create a non-zero group advantage.

Every family's scorer is total over responses (``reward_fns.total``): each call also carries the
numeric ``reward/<family>/internal_errors`` and ``reward/<family>/timeouts`` of every selected
family (1.0 when the verifier failed internally on this response, or the response ran past the
family's deadline, and scored 0), and an unreadable ground truth raises ``GroundTruthError`` naming
the row. Every family checks responses in its own worker pool under the deadline ``timeout_s``
(``reward_fns.process_pool.deadline``); these settings in ``reward_kwargs`` reach every family.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from reward_fns import instruction_following, text_to_sql, tool_calling
from reward_fns.total import internal_errors_key, timeouts_key

__all__ = ["FAMILIES", "compute_score", "counter_keys", "family_for", "info_key", "reward_keys"]

FILLER_SCORE = 0.0
FILLER_INFO = ""


@dataclass(frozen=True)
class Family:
    """A task family: the data sources it serves, its reward keys and its scorer."""

    name: str
    module: ModuleType

    @property
    def data_sources(self) -> tuple[str, ...]:
        return tuple(self.module.DATA_SOURCES)

    def reward_keys(self, max_constraints: int | None) -> tuple[str, ...]:
        if self is FAMILIES["instruction_following"] and max_constraints is not None:
            return tuple(instruction_following.reward_keys(max_constraints))
        return tuple(self.module.REWARD_KEYS)

    @property
    def compute_score(self) -> Callable[..., dict[str, Any]]:
        return self.module.compute_score  # type: ignore[no-any-return]


FAMILIES: dict[str, Family] = {
    "text_to_sql": Family("text_to_sql", text_to_sql),
    "tool_calling": Family("tool_calling", tool_calling),
    "instruction_following": Family("instruction_following", instruction_following),
}


def info_key(reward_key: str) -> str:
    """The verifier-information key that accompanies a reward key."""
    return f"{reward_key}_info"


def _selected(families: Iterable[str] | None) -> list[Family]:
    if families is None:
        return list(FAMILIES.values())
    names = [families] if isinstance(families, str) else list(families)
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise ValueError(f"reward_fns: unknown families {unknown or names}; choose from {list(FAMILIES)}")
    return [FAMILIES[n] for n in names]


def reward_keys(families: Sequence[str] | str | None = None, max_constraints: int | None = None) -> tuple[str, ...]:
    """Every reward component key the selected families return, in a fixed order."""
    return tuple(key for family in _selected(families) for key in family.reward_keys(max_constraints))


def counter_keys(families: Sequence[str] | str | None = None) -> tuple[str, ...]:
    """The numeric ``reward/<family>/internal_errors`` and ``reward/<family>/timeouts`` keys of every
    selected family and its own counters (its module's ``COUNTER_KEYS``, e.g. instruction following's
    ``language_undetected``), in a fixed order."""
    return tuple(
        key
        for family in _selected(families)
        for key in (
            internal_errors_key(family.name),
            timeouts_key(family.name),
            *getattr(family.module, "COUNTER_KEYS", ()),
        )
    )


def family_for(data_source: str, families: Sequence[str] | str | None = None) -> Family:
    """The family serving ``data_source`` (case-insensitive; exact, or a prefix before '/', '_' or '-')."""
    source = str(data_source).lower()
    for family in _selected(families):
        for known in family.data_sources:
            if source == known or (source.startswith(known) and source[len(known)] in "/_-:."):
                return family
    served = {f.name: f.data_sources for f in _selected(families)}
    raise ValueError(f"reward_fns: no verifier for data_source {data_source!r}; known: {served}")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    families: Sequence[str] | str | None = None,
    max_constraints: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """verl custom reward function: ``score`` + every component of the selected families + infos.

    Args:
        data_source: the sample's ``data_source`` column; picks the family.
        solution_str: the decoded response.
        ground_truth: the sample's ``reward_model.ground_truth`` (schema per family).
        extra_info: the sample's ``extra_info`` column.
        families: restrict the key set to these families (``reward.custom_reward_function.reward_kwargs``);
            default all three.
        max_constraints: instruction-following slot count (default: that family's own default).
        **kwargs: passed on to the family's scorer (e.g. ``db_root``, ``timeout_s``, ``sandbox_workers``).

    Returns:
        ``{"score": float, <component>: float, <component>_info: str, ...,
        "reward/<family>/internal_errors": float, "reward/<family>/timeouts": float, ...}`` with the
        same keys for every sample.

    Raises:
        ValueError: no family serves ``data_source``.
        reward_fns.total.GroundTruthError: the sample's ground truth cannot be read.
    """
    family = family_for(data_source, families)
    if family.name == "instruction_following" and max_constraints is not None:
        kwargs["max_constraints"] = max_constraints
    own = family.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    result: dict[str, Any] = {"score": float(own["score"])}
    for key in reward_keys(families, max_constraints):
        if key in own:
            result[key] = float(own[key])
            result[info_key(key)] = str(own[info_key(key)])
        else:
            result[key] = FILLER_SCORE
            result[info_key(key)] = FILLER_INFO
    for key in counter_keys(families):
        result[key] = float(own.get(key, 0.0))
    return result

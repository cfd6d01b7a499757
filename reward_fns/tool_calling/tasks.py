"""The tool-calling work a pool worker runs, as plain-data tasks (``TASKS``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reward_fns.tool_calling.verifier import score_response

TASKS: dict[str, Callable[..., Any]] = {"score": score_response}

"""A task module for the zygote tests: its ``warm_up`` records the process it ran in."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

WARMED_IN: int | None = None


def warm_up() -> None:
    global WARMED_IN
    WARMED_IN = os.getpid()


def warmed_in() -> dict[str, int | None]:
    """The process that ran ``warm_up`` in this process's memory, and this process."""
    return {"warmed_in": WARMED_IN, "serving_in": os.getpid()}


TASKS: dict[str, Callable[..., Any]] = {"warmed_in": warmed_in}

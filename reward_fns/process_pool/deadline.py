"""Run one family task under the reward's wall-clock deadline, in the family's worker pool or in-process.

Every family's ``compute_score`` takes the same settings (``reward_kwargs`` reach every family
through the dispatcher):

* ``timeout_s`` (default :data:`DEFAULT_TIMEOUT_S`): the wall-clock limit on checking one response,
  counted from the moment a worker takes it. Past it the worker is killed, the call raises
  `pool.DeadlineExceeded` (a ``reward_fns.total.ResponseTimeout``) and the response scores 0,
  counted in ``reward/<family>/timeouts``;
* ``sandbox_workers`` (default `pool.default_workers()`, ``min(32, os.cpu_count() + 4)``): worker
  processes of the family's pool;
* ``sandbox_memory_bytes``: the address-space limit of each worker;
* ``isolation``: ``"process"`` (the default) or ``"inprocess"`` (no deadline at all; only for
  measuring what the isolation costs, never for training).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

from reward_fns.process_pool.pool import (
    DEFAULT_MEMORY_LIMIT_BYTES,
    DEFAULT_WORKERS,
    MAX_TIMEOUT_S,
    MIN_MEMORY_LIMIT_BYTES,
    shared_pool,
)
from reward_fns.total import RewardConfigError

DEFAULT_TIMEOUT_S = 5.0
"""The deadline of every family (text-to-SQL's query deadline has the same default)."""

ISOLATION_MODES: tuple[str, ...] = ("process", "inprocess")


def check_pool_settings(workers: Any, memory_limit_bytes: Any, family: str) -> None:
    """Raises RewardConfigError unless both are integers the pool accepts (`family` prefixes the message)."""
    for name, value, least in (
        ("sandbox_workers", workers, 1),
        ("sandbox_memory_bytes", memory_limit_bytes, MIN_MEMORY_LIMIT_BYTES),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise RewardConfigError(f"{family}{name} must be an integer ≥ {least}, got {value!r}")


@dataclass(frozen=True)
class DeadlineSettings:
    """How one family's task runs; built from ``compute_score``'s keyword arguments and checked.

    Raises:
        RewardConfigError: a setting is out of range (raised, never scored as 0).
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    isolation: str = "process"
    workers: int = DEFAULT_WORKERS
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_MODES:
            raise RewardConfigError(f"unknown isolation {self.isolation!r}; expected one of {ISOLATION_MODES}")
        timeout = self.timeout_s
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_TIMEOUT_S
        ):
            raise RewardConfigError(
                f"timeout_s must be a positive number of seconds up to {MAX_TIMEOUT_S:g}, got {timeout!r}"
            )
        check_pool_settings(self.workers, self.memory_limit_bytes, "")

    @classmethod
    def from_kwargs(
        cls,
        timeout_s: Any = DEFAULT_TIMEOUT_S,
        isolation: Any = "process",
        sandbox_workers: Any = None,
        sandbox_memory_bytes: Any = None,
    ) -> DeadlineSettings:
        """The settings from ``compute_score``'s keyword arguments (None: the default)."""
        return cls(
            timeout_s=timeout_s,
            isolation=isolation,
            workers=DEFAULT_WORKERS if sandbox_workers is None else sandbox_workers,
            memory_limit_bytes=DEFAULT_MEMORY_LIMIT_BYTES if sandbox_memory_bytes is None else sandbox_memory_bytes,
        )


def run_task(tasks_module: str, label: str, task_name: str, kwargs: dict[str, Any], settings: DeadlineSettings) -> Any:
    """Runs ``tasks_module.TASKS[task_name](**kwargs)`` under the settings and returns its value.

    Args:
        tasks_module: The family's task module (imported by its workers).
        label: The family's name in messages ("instruction-following").
        task_name: The task.
        kwargs: Its arguments (plain data).
        settings: Deadline, isolation and pool settings.

    Raises:
        pool.DeadlineExceeded: the worker overran the deadline and was killed.
        pool.WorkerFailure: the worker died, or the task raised (the message names the error).
        pool.WorkerStartError, pool.PoolBrokenError: the pool itself is broken.
    """
    if settings.isolation == "inprocess":
        return importlib.import_module(tasks_module).TASKS[task_name](**kwargs)
    pool = shared_pool(tasks_module, settings.workers, settings.memory_limit_bytes, label)
    return pool.call(task_name, kwargs, settings.timeout_s)

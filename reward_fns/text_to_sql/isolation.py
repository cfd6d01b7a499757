"""Where the SQL tasks run: in the shared worker pool (the default) or in the calling process.

``isolation="process"`` (default) runs every task that touches untrusted SQL in a
sandbox worker process (``reward_fns.process_pool``): hard memory limit, deadline enforced by
killing the worker. ``isolation="inprocess"`` runs the same tasks in the calling
process with only SQLite's own guards; it exists to measure what isolation costs
(`benchmarks.reward_throughput`) and must not be used for training, since a
single response can then stall or exhaust the reward process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reward_fns.process_pool.deadline import check_pool_settings
from reward_fns.process_pool.pool import DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_WORKERS, WorkerFailure, shared_pool
from reward_fns.text_to_sql.sql_tasks import TASKS
from reward_fns.total import RewardConfigError

TASKS_MODULE = "reward_fns.text_to_sql.sql_tasks"

ISOLATION_MODES: tuple[str, ...] = ("process", "inprocess")


@dataclass(frozen=True)
class Isolation:
    """How SQL tasks run; hashable, so it can be part of a cache key.

    Attributes:
        mode: "process" or "inprocess" (see the module docstring).
        workers: Worker processes in the pool ("process" only).
        memory_limit_bytes: Address-space limit of each worker ("process" only).
    """

    mode: str = "process"
    workers: int = DEFAULT_WORKERS
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES

    def __post_init__(self) -> None:
        if self.mode not in ISOLATION_MODES:
            raise RewardConfigError(f"unknown text-to-SQL isolation {self.mode!r}; expected one of {ISOLATION_MODES}")
        check_pool_settings(self.workers, self.memory_limit_bytes, "text-to-SQL ")

    def run(self, task_name: str, kwargs: dict[str, Any], timeout_s: float) -> Any:
        """Runs a task of `sql_tasks.TASKS` and returns its value.

        Args:
            task_name: The task's name.
            kwargs: Its arguments (plain data).
            timeout_s: Its deadline (enforced by killing the worker in "process" mode).

        Raises:
            WorkerFailure: If the task raised, or its worker overran the deadline or died.
        """
        if self.mode == "process":
            # No timer in the worker: SQLite's progress handler stops a query at its deadline with a
            # clearer message, and the parent kills a worker stuck in one long instruction.
            pool = shared_pool(TASKS_MODULE, self.workers, self.memory_limit_bytes, "SQL", timer_in_worker=False)
            return pool.call(task_name, kwargs, timeout_s)
        try:
            return TASKS[task_name](**kwargs)
        except Exception as error:  # the same contract as a worker's error reply
            raise WorkerFailure(f"{type(error).__name__}: {error}") from error

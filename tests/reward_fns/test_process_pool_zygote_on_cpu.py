"""Every family's workers are forked by one zygote per pool, which imported the family's libraries once.

A replacement after a kill is therefore a fork of the zygote (its parent is the zygote, whose pid
has not changed), not a fresh interpreter that imports scipy or NLTK again. Real pools, real
processes, real checks; no timing is asserted (`benchmarks.reward_throughput` measures it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reward_fns.instruction_following.data import load_benchmark
from reward_fns.instruction_following.verifier import TASKS_MODULE as IF_TASKS
from reward_fns.process_pool.pool import DeadlineExceeded, WorkerPool
from reward_fns.text_to_sql import BUNDLED_DB_ROOT
from reward_fns.text_to_sql.isolation import TASKS_MODULE as SQL_TASKS
from reward_fns.tool_calling.bfcl_data import load_bfcl_category
from reward_fns.tool_calling.verifier import TASKS_MODULE as TOOL_TASKS
from reward_fns.tool_calling.verifier import ground_truth_text

MEMORY_LIMIT_BYTES = 1024**3


def sql_request() -> tuple[str, dict[str, Any], Callable[[Any], bool]]:
    database = str(BUNDLED_DB_ROOT / "world_1.sqlite")
    return "table_definitions", {"db_path": database}, lambda value: "city" in value


def tool_request() -> tuple[str, dict[str, Any], Callable[[Any], bool]]:
    item = load_bfcl_category("simple_python")[0]
    response = '[calculate_triangle_area(base=10, height=5, unit="units")]'
    request = {"ground_truth": ground_truth_text(item.ground_truth()), "response": response}
    return "score", request, lambda value: value["tool_format"] == 1.0


def if_request() -> tuple[str, dict[str, Any], Callable[[Any], bool]]:
    record = next(iter(load_benchmark("ifeval")))
    truth = {key: record[key] for key in ("instruction_id_list", "kwargs", "prompt")}
    request = {"ground_truth": truth, "response": record["prompt"], "max_constraints": 3}
    return "score", request, lambda value: "scores" in value


# tasks module -> (a compiled library the family imports, seen in a process's memory map; a request)
FAMILIES: dict[str, tuple[str, Callable[[], tuple[str, dict[str, Any], Callable[[Any], bool]]]]] = {
    SQL_TASKS: ("_sqlite3", sql_request),
    TOOL_TASKS: ("scipy", tool_request),
    IF_TASKS: ("pandas", if_request),
}


def parent_of(pid: int) -> int:
    """The parent process id, from /proc (the field after the parenthesised command name)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def gone(pid: int) -> bool:
    """True once a process has exited (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or between the open and the read
        return True
    return "\nState:\tZ" in status


def wait_until_gone(pid: int) -> bool:
    give_up = time.monotonic() + 10.0
    while not gone(pid) and time.monotonic() < give_up:
        time.sleep(0.01)
    return gone(pid)


def live_children_of(pid: int, wait_for: Callable[[set[int]], bool] = bool) -> set[int]:
    """The process's children that have not exited, once `wait_for` holds of them (or after 10 s)."""
    give_up = time.monotonic() + 10.0
    while True:
        listed = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        children = {int(child) for child in listed if not gone(int(child))}
        if wait_for(children) or time.monotonic() > give_up:
            return children
        time.sleep(0.01)


@pytest.fixture(params=list(FAMILIES), ids=["text_to_sql", "tool_calling", "instruction_following"])
def family_pool(request: pytest.FixtureRequest) -> Iterator[tuple[WorkerPool, str]]:
    pool = WorkerPool(request.param, size=1, memory_limit_bytes=MEMORY_LIMIT_BYTES, label="test")
    try:
        yield pool, request.param
    finally:
        pool.close()


def test_workers_and_their_replacements_are_forks_of_one_single_threaded_zygote(
    family_pool: tuple[WorkerPool, str],
) -> None:
    pool, tasks_module = family_pool
    library, make_request = FAMILIES[tasks_module]
    task, kwargs, answered = make_request()
    assert answered(pool.call(task, kwargs, 30.0))
    zygote = pool.zygote_pid()
    assert zygote is not None and parent_of(zygote) == os.getpid()
    # The zygote holds the family's libraries and forks only while it is alone in its process.
    assert library in Path(f"/proc/{zygote}/maps").read_text()
    assert threads_of(zygote) == 1
    (first,) = pool.worker_pids()
    assert parent_of(first) == zygote
    limits = Path(f"/proc/{first}/limits").read_text().splitlines()
    assert any(line.startswith("Max address space") and str(MEMORY_LIMIT_BYTES) in line for line in limits)

    os.kill(first, signal.SIGKILL)  # an outside kill: the next call replaces the worker before using it
    assert wait_until_gone(first)
    assert answered(pool.call(task, kwargs, 30.0))
    (replacement,) = pool.worker_pids()
    assert replacement != first and pool.kills == 1
    assert pool.zygote_pid() == zygote and parent_of(replacement) == zygote  # forked, not a fresh interpreter

    pool.close()
    assert wait_until_gone(replacement) and wait_until_gone(zygote)


def test_a_worker_killed_at_its_deadline_is_replaced_by_a_fork_of_the_same_zygote() -> None:
    pool = WorkerPool(SQL_TASKS, size=1, label="SQL", timer_in_worker=False)
    database = str(BUNDLED_DB_ROOT / "world_1.sqlite")
    bomb = "```sql\nSELECT printf('%.*c', 2147483647, 'x') IS NULL\n```"
    try:
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)
        zygote, (victim,) = pool.zygote_pid(), pool.worker_pids()
        request = {"response": bomb, "db_path": database, "timeout_s": 0.2, "row_cap": 10}
        with pytest.raises(DeadlineExceeded, match="was killed"):
            pool.call("check_response", request, 0.2)  # one SQLite instruction: only a kill stops it
        assert pool.kills == 1 and wait_until_gone(victim)  # killed by a signal; its exit follows
        # The replacement's fork was sent with the kill: the zygote forks it before any next call.
        forked = live_children_of(zygote, wait_for=lambda children: bool(children - {victim}))
        assert len(forked - {victim}) == 1
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)
        (replacement,) = pool.worker_pids()
        assert {replacement} == forked - {victim}  # the next call took that very worker, forked no other
        assert parent_of(replacement) == zygote and pool.zygote_pid() == zygote
        assert live_children_of(zygote) - {victim} == {replacement}
    finally:
        pool.close()


def test_a_zygote_killed_from_outside_is_started_again_and_no_answer_is_blamed() -> None:
    pool = WorkerPool(SQL_TASKS, size=1, label="SQL", timer_in_worker=False)
    database = str(BUNDLED_DB_ROOT / "world_1.sqlite")
    try:
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)
        zygote, (orphan,) = pool.zygote_pid(), pool.worker_pids()
        assert zygote is not None
        os.kill(zygote, signal.SIGKILL)
        assert wait_until_gone(zygote)
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)  # the orphan still answers
        os.kill(orphan, signal.SIGKILL)
        assert wait_until_gone(orphan)
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)
        (worker,) = pool.worker_pids()
        assert pool.zygote_pid() not in (None, zygote) and parent_of(worker) == pool.zygote_pid()
    finally:
        pool.close()


def test_a_worker_that_reads_no_request_is_killed_at_the_deadline_not_waited_for() -> None:
    """The request is written under the deadline: a stopped worker never drains the pipe (64 KiB)."""
    pool = WorkerPool(SQL_TASKS, size=1, label="SQL", timer_in_worker=False)
    database = str(BUNDLED_DB_ROOT / "world_1.sqlite")
    outcome: list[BaseException | None] = []

    def call_with_a_large_request() -> None:
        try:
            pool.call("table_definitions", {"db_path": database, "padding": "x" * (1 << 20)}, 0.5)
            outcome.append(None)
        except BaseException as error:
            outcome.append(error)

    try:
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)
        (stopped,) = pool.worker_pids()
        os.kill(stopped, signal.SIGSTOP)
        caller = threading.Thread(target=call_with_a_large_request)
        caller.start()
        caller.join(timeout=30.0)
        assert not caller.is_alive(), "the call waited for a worker that never read its request"
        (error,) = outcome
        assert isinstance(error, DeadlineExceeded) and pool.kills == 1
        assert wait_until_gone(stopped)
        assert "city" in pool.call("table_definitions", {"db_path": database}, 5.0)
    finally:
        pool.close()


def test_a_task_modules_warm_up_runs_once_in_the_zygote_and_every_worker_inherits_it() -> None:
    pool = WorkerPool("tests.reward_fns.zygote_warm_up_tasks", size=2, label="test")
    try:
        first = pool.call("warmed_in", {}, 10.0)
        zygote = pool.zygote_pid()
        assert first["warmed_in"] == zygote and first["serving_in"] != zygote
        os.kill(first["serving_in"], signal.SIGKILL)
        assert wait_until_gone(first["serving_in"])
        again = pool.call("warmed_in", {}, 10.0)  # a new fork: warm without running warm_up itself
        assert again["warmed_in"] == zygote and again["serving_in"] not in (zygote, first["serving_in"])
    finally:
        pool.close()

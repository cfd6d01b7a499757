"""A fault of the verifier's own machinery stops the call with a clear error after bounded retries.

Each test breaks the machinery for real: the workers cannot find their checker data (a cache
folder that cannot be created), or their task module, or the verifier fails on every response.
Nothing is mocked; the pools are real worker processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from reward_fns import dispatch, total
from reward_fns.instruction_following import verifier as if_verifier
from reward_fns.instruction_following.data import load_benchmark
from reward_fns.process_pool import pool as process_pool
from reward_fns.process_pool.pool import PoolBrokenError, WorkerPool, WorkerStartError, close_shared_pool
from reward_fns.text_to_sql import BUNDLED_DB_ROOT
from reward_fns.text_to_sql.isolation import TASKS_MODULE as SQL_TASKS
from reward_fns.tool_calling import verifier as tool_calling_verifier
from reward_fns.tool_calling.bfcl_data import load_bfcl_category
from reward_fns.total import VerifierFaultError


@pytest.fixture(autouse=True)
def fresh_pools() -> Any:
    close_shared_pool()
    yield
    close_shared_pool()


def test_a_pool_whose_workers_cannot_find_their_checker_data_stops_the_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The workers write NLTK's Punkt model under $XDG_CACHE_HOME; a file in the way makes that fail.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    record = next(iter(load_benchmark("ifeval")))
    long_answer = "Hello. " * if_verifier.INLINE_MAX_CHECKED_CHARS  # too long for the calling thread: the pool
    assert not if_verifier.checked_in_thread(long_answer, len(record["instruction_id_list"]))
    started = time.monotonic()
    with pytest.raises(VerifierFaultError, match=r"no instruction-following worker process could start in 3 attempts"):
        dispatch.compute_score("ifeval", long_answer, record, {"index": 0}, sandbox_workers=1)
    assert time.monotonic() - started < 60.0
    # Loud on every later call too, never a silent 0.
    with pytest.raises(WorkerStartError):
        dispatch.compute_score("ifeval", long_answer + "!", record, {"index": 1}, sandbox_workers=1)


def test_a_reward_process_that_cannot_load_the_checkers_stops_short_answers_too(tmp_path: Path) -> None:
    # A short answer is checked in the reward process itself, which must then write NLTK's Punkt model
    # under $XDG_CACHE_HOME; a fresh process (this one may have written it already) with a file in the way.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    script = (
        "from reward_fns import dispatch\n"
        "from reward_fns.instruction_following.data import load_benchmark\n"
        "from reward_fns.total import VerifierFaultError\n"
        "record = next(iter(load_benchmark('ifeval')))\n"
        "for index in range(2):\n"
        "    try:\n"
        "        result = dispatch.compute_score('ifeval', 'Hello.', record, {'index': index})\n"
        "    except VerifierFaultError as error:\n"
        "        print('LOUD', str(error).splitlines()[0])\n"
        "    else:\n"
        "        print('SCORED', result['score'])\n"
    )
    environment = {**os.environ, "XDG_CACHE_HOME": str(blocker / "cache")}
    finished = subprocess.run(
        [sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300, check=True
    )
    lines = [line for line in finished.stdout.splitlines() if line.startswith(("LOUD", "SCORED"))]
    assert len(lines) == 2 and all(line.startswith("LOUD") for line in lines), finished.stdout + finished.stderr
    assert "checker libraries cannot be loaded in the reward process" in lines[0]
    assert "not-a-folder" in lines[0]


def test_an_sql_pool_that_cannot_start_stops_the_call_instead_of_scoring_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A broken Python home, as after a half-finished upgrade: no worker interpreter can start.
    monkeypatch.setenv("PYTHONHOME", str(tmp_path / "no-python-here"))
    truth = {"sql": "SELECT count(*) FROM city", "db_id": "world_1"}
    answer = "```sql\nSELECT count(*) FROM city\n```"
    with pytest.raises(VerifierFaultError, match=r"no SQL worker process could start in 3 attempts"):
        dispatch.compute_score("spider", answer, truth, {"index": 0}, sandbox_workers=1)


def test_a_pool_that_cannot_import_its_tasks_gives_up_after_three_attempts() -> None:
    pool = WorkerPool("reward_fns.no_such_task_module", size=2, label="test")
    try:
        with pytest.raises(WorkerStartError, match="could start in 3 attempts") as caught:
            pool.call("score", {}, 1.0)
        assert isinstance(caught.value, VerifierFaultError)
        assert pool.kills >= process_pool.START_ATTEMPTS
    finally:
        pool.close()


def test_workers_that_keep_dying_on_their_own_stop_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each worker is killed from outside while its query runs (as an OOM killer or a broken node would).
    monkeypatch.setattr(process_pool, "MAX_DEATHS_IN_A_ROW", 3)
    pool = WorkerPool(SQL_TASKS, size=1, label="SQL")
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    request = {"sql": endless, "db_path": str(BUNDLED_DB_ROOT / "world_1.sqlite"), "timeout_s": 30.0, "row_cap": 10}
    errors: list[BaseException] = []

    def run_and_kill() -> None:
        caller = threading.Thread(target=lambda: errors.append(capture(pool.call, "run_gold", request, 30.0)))
        caller.start()
        give_up = time.monotonic() + 30.0
        while not pool.running_pids() and time.monotonic() < give_up:  # until a ready worker took the query
            time.sleep(0.01)
        (pid,) = pool.running_pids()
        os.kill(pid, signal.SIGKILL)
        caller.join(timeout=10.0)
        assert not caller.is_alive()

    try:
        for _ in range(3):
            run_and_kill()
        assert [type(error) for error in errors] == [process_pool.WorkerFailure] * 2 + [PoolBrokenError]
        assert "3 SQL worker processes in a row died on their own" in str(errors[-1])
    finally:
        pool.close()


def capture(function: Any, *args: Any) -> BaseException:
    try:
        function(*args)
    except BaseException as error:
        return error
    raise AssertionError("the call did not fail")


def test_a_bug_on_every_response_stops_the_run_after_a_bounded_count(monkeypatch: pytest.MonkeyPatch) -> None:
    total.reset_internal_errors()
    monkeypatch.setattr(total, "MAX_INTERNAL_ERRORS_IN_A_ROW", 5)

    def broken_score_calls(calls: Any, reference: Any) -> Any:  # a verifier bug that every response hits
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(tool_calling_verifier, "score_calls", broken_score_calls)
    item = load_bfcl_category("simple_python")[0]
    response = '<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}</tool_call>'
    for index in range(4):
        result = dispatch.compute_score("bfcl", response, item.ground_truth(), {"index": index}, isolation="inprocess")
        assert result["reward/tool_calling/internal_errors"] == 1.0
    with pytest.raises(VerifierFaultError, match="failed internally on 5 responses in a row"):
        dispatch.compute_score("bfcl", response, item.ground_truth(), {"index": 4}, isolation="inprocess")
    total.reset_internal_errors()


def test_a_hostile_response_is_not_a_fault_of_the_pool() -> None:
    # Deadline kills are the response's doing: they never count towards the pool's death limit.
    truth = {"sql": "SELECT 1", "db_id": "world_1"}
    bomb = "```sql\nSELECT printf('%.*c', 2147483647, 'x') IS NULL\n```"
    for _ in range(process_pool.MAX_DEATHS_IN_A_ROW + 1):
        result = dispatch.compute_score("spider", bomb, truth, {}, timeout_s=0.2, sandbox_workers=2)
        assert result["score"] == 0.0 and result["reward/text_to_sql/timeouts"] == 1.0
    assert process_pool.shared_pool(SQL_TASKS, 2, label="SQL").kills == process_pool.MAX_DEATHS_IN_A_ROW + 1


def test_a_request_the_worker_cannot_read_is_answered_and_the_worker_stays() -> None:
    """A numpy scalar in a request is refused by the worker's plain-data reader: an error reply, not a death."""
    import numpy as np

    pool = WorkerPool(SQL_TASKS, size=1, label="SQL", timer_in_worker=False)
    database = str(next(BUNDLED_DB_ROOT.rglob("*.sqlite")))
    try:
        with pytest.raises(process_pool.WorkerFailure, match="unreadable request"):
            pool.call("table_definitions", {"db_path": database, "extra": np.int64(1)}, 5.0)
        before = pool.worker_pids()
        assert isinstance(pool.call("table_definitions", {"db_path": database}, np.float64(5.0)), dict)
        assert pool.worker_pids() == before and pool.kills == 0
    finally:
        pool.close()


@pytest.mark.parametrize(("setting", "value"), [("timeout_s", 1e9), ("sandbox_memory_bytes", 1024**2)])
def test_settings_the_pool_cannot_honour_are_refused(setting: str, value: Any) -> None:
    from reward_fns.process_pool.deadline import DeadlineSettings

    with pytest.raises(total.RewardConfigError, match=setting):
        DeadlineSettings.from_kwargs(**{setting: value})

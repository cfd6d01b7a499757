"""The SQL sandbox's worker processes: hostile responses cost at most their deadline, nothing leaks or changes.

Every test runs real worker processes on real copies of the bundled Spider databases.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reward_fns.process_pool import pool as process_pool
from reward_fns.process_pool.pool import WorkerFailure, WorkerPool, close_shared_pool
from reward_fns.process_pool.protocol import decode_body
from reward_fns.process_pool.worker import MAX_TEMP_FILE_BYTES
from reward_fns.text_to_sql import BUNDLED_DB_ROOT, REWARD_KEYS, compute_score
from reward_fns.text_to_sql.isolation import TASKS_MODULE, Isolation
from reward_fns.total import RewardConfigError

# Bounds on wall or CPU time: run alone, after the two-worker part of `make test` (Makefile).
pytestmark = pytest.mark.serial

DEADLINE_S = 1.0
# A hostile response costs at most its deadline plus half a second.
WALL_MARGIN_S = 0.5
NUMERIC_KEYS = {"score", *REWARD_KEYS}
INFO_KEYS = {f"{key}_info" for key in REWARD_KEYS}
PRINTF_BOMB = "printf('%.*c', 2147483647, 'x') IS NULL"
ZEROBLOB_CTE = (
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i<64) SELECT "
    + ", ".join(["zeroblob(999999)"] * 32)
    + " FROM r"
)

# name -> (SQL of the ```sql block, a fragment every info string or the format/executability info shows)
HOSTILE_QUERIES = {
    "nested-parentheses": ("SELECT " + "(" * 46 + "1" + ")" * 46, "nests parentheses 46 levels deep"),
    "nested-coalesce": ("SELECT " + "coalesce(" * 50 + "1" + ")" * 50, "nests parentheses 50 levels deep"),
    "nested-not-without-parentheses": ("SELECT " + "NOT " * 3000 + "1", "nested too deeply for the SQL parser"),
    "printf-huge-width": (f"SELECT {PRINTF_BOMB}", "did not answer within the 1 s deadline and was killed"),
    "three-printf-bombs": (
        f"SELECT {PRINTF_BOMB}, {PRINTF_BOMB}, {PRINTF_BOMB}",
        "did not answer within the 1 s deadline and was killed",
    ),
    "zeroblob-rows": (ZEROBLOB_CTE, "result too large"),
    "sum-over-64-kib": ("SELECT " + " + ".join(["1"] * 40_000), "over 65536 bytes are refused"),
    "one-megabyte-sum": ("SELECT " + " + ".join(["1"] * 250_000), "refused"),
    "lone-surrogate": ("SELECT 'a\ud800b'", "lone surrogate"),
    "endless-cte": (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
        "timed out after 1 s",
    ),
    "attach": ("ATTACH DATABASE '{tmp}/attached.sqlite' AS other", "'ATTACH'"),
    "vacuum-into": ("VACUUM INTO '{tmp}/copy.sqlite'", "'VACUUM'"),
    "load-extension": ("SELECT load_extension('{tmp}/evil.so')", "load_extension"),
    "pragma-write": ("PRAGMA user_version = 5", "'PRAGMA'"),
    "dml-behind-cte": ("WITH x AS (SELECT 1) DELETE FROM city", "the statement is a DELETE"),
}


def shared_pool(size: int = process_pool.DEFAULT_WORKERS) -> WorkerPool:
    """This process's SQL pool (the one compute_score uses)."""
    return process_pool.shared_pool(TASKS_MODULE, size, label="SQL")


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file in a folder (and so which files exist)."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


def rss_bytes() -> int:
    """This process's resident set size, from /proc (Linux)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def world_copy(tmp_path: Path) -> Iterator[Path]:
    """A private copy of world_1 in its own folder, and a fresh shared pool closed afterwards."""
    folder = tmp_path / "db"
    folder.mkdir()
    copy = folder / "world_1.sqlite"
    shutil.copyfile(BUNDLED_DB_ROOT / "world_1.sqlite", copy)
    close_shared_pool()
    yield copy
    close_shared_pool()


def score(response: str, database: Path, **kwargs: object) -> dict[str, float | str]:
    ground_truth = {"sql": "SELECT count(*) FROM city", "db_path": str(database)}
    return compute_score("spider", response, ground_truth, **{"timeout_s": DEADLINE_S, **kwargs})


def fenced(sql: str) -> str:
    return f"```sql\n{sql}\n```"


def assert_well_formed(result: dict[str, float | str]) -> None:
    assert set(result) >= NUMERIC_KEYS | INFO_KEYS
    assert all(isinstance(result[key], float) for key in NUMERIC_KEYS)
    assert all(isinstance(result[key], str) and result[key] for key in INFO_KEYS)


@pytest.mark.parametrize("name", sorted(HOSTILE_QUERIES))
def test_hostile_response_scores_zero_within_its_deadline_and_the_pool_keeps_answering(
    name: str, world_copy: Path, tmp_path: Path
) -> None:
    sql, reason = HOSTILE_QUERIES[name]
    assert score(fenced("SELECT count(*) FROM city"), world_copy)["score"] == 1.0  # pool up, gold cached
    before = fingerprint(world_copy.parent)
    parent_rss = rss_bytes()
    started = time.monotonic()
    result = score(fenced(sql.format(tmp=tmp_path)), world_copy)
    elapsed = time.monotonic() - started
    assert elapsed <= DEADLINE_S + WALL_MARGIN_S
    assert_well_formed(result)
    assert (result["sql_executability"], result["sql_execution"]) == (0.0, 0.0)
    assert reason in str(result["sql_format_info"]) + str(result["sql_executability_info"])
    # The parent never held the hostile result (the zeroblob rows would be 2 GB).
    assert rss_bytes() - parent_rss < 64 * 1024**2
    assert fingerprint(world_copy.parent) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["db"]
    # Stopped at the deadline, whether by SQLite's progress handler or by the parent's kill: counted as a timeout.
    stopped_at_deadline = "timed out" in reason or "deadline" in reason
    assert result["reward/text_to_sql/timeouts"] == (1.0 if stopped_at_deadline else 0.0), name
    assert score(fenced("SELECT count(*) FROM city"), world_copy)["score"] == 1.0


def test_a_killed_worker_scores_zero_and_every_info_says_so(world_copy: Path) -> None:
    result = score(fenced(f"SELECT {PRINTF_BOMB}"), world_copy)
    assert result["score"] == 0.0
    for key in INFO_KEYS:
        assert "Sandbox: the SQL worker did not answer within the 1 s deadline and was killed" in str(result[key])
    assert shared_pool().kills == 1


def test_a_worker_killed_by_a_signal_mid_query_scores_zero_and_is_replaced(world_copy: Path) -> None:
    endless = fenced("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n")
    assert score(fenced("SELECT 1"), world_copy, sandbox_workers=1)["sql_executability"] == 1.0
    (victim,) = shared_pool(size=1).worker_pids()
    results: list[dict[str, float | str]] = []
    caller = threading.Thread(
        target=lambda: results.append(score(endless, world_copy, timeout_s=30.0, sandbox_workers=1))
    )
    started = time.monotonic()
    caller.start()
    time.sleep(0.3)  # the query is running by now: it only ends at its 30 s deadline
    os.kill(victim, signal.SIGKILL)
    caller.join(timeout=10.0)
    assert not caller.is_alive() and time.monotonic() - started < 5.0
    (result,) = results
    assert result["score"] == 0.0
    assert "the SQL worker process died while checking (SIGKILL)" in str(result["sql_executability_info"])
    assert not process_exists(victim)
    assert score(fenced("SELECT count(*) FROM city"), world_copy, sandbox_workers=1)["score"] == 1.0
    (replacement,) = shared_pool(size=1).worker_pids()
    assert replacement != victim
    # A worker killed while idle is replaced before use: the next answer is not blamed for it.
    os.kill(replacement, signal.SIGKILL)
    give_up = time.monotonic() + 10.0
    while not process_gone(replacement) and time.monotonic() < give_up:  # a zombie of the zygote until reaped
        time.sleep(0.01)
    assert score(fenced("SELECT count(*) FROM city"), world_copy, sandbox_workers=1)["score"] == 1.0
    assert shared_pool(size=1).worker_pids() not in ([victim], [replacement])


def test_a_sort_that_spills_to_temporary_files_stops_at_the_file_size_limit(world_copy: Path) -> None:
    # About 40 GB of sort records: SQLite writes them to temporary files (800 MB in 5 s here) until
    # RLIMIT_FSIZE makes the write fail, well before the deadline.
    spill = (
        "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i<20000000) "
        "SELECT i, randomblob(2000) FROM r ORDER BY 2"
    )
    assert score(fenced("SELECT 1"), world_copy)["sql_executability"] == 1.0
    started = time.monotonic()
    result = score(fenced(spill), world_copy, timeout_s=20.0)
    assert time.monotonic() - started < 20.0
    assert "Execution error: OperationalError: disk I/O error" in str(result["sql_executability_info"])
    assert shared_pool().kills == 0


def test_parent_memory_does_not_grow_over_a_thousand_hostile_calls(world_copy: Path, tmp_path: Path) -> None:
    # Cheap hostile answers (each refused or stopped in milliseconds); the expensive ones are above.
    cheap = [
        fenced(HOSTILE_QUERIES["nested-parentheses"][0]),
        fenced(HOSTILE_QUERIES["lone-surrogate"][0]),
        fenced(HOSTILE_QUERIES["dml-behind-cte"][0]),
        fenced(HOSTILE_QUERIES["load-extension"][0].format(tmp=tmp_path)),
        fenced("SELECT zeroblob(2000000)"),
        "```sql\nSELECT 'unterminated\n```",
        "x" * 70_000,
    ]
    for response in cheap * 20:  # warm-up: caches, allocator arenas
        score(response, world_copy)
    before = rss_bytes()
    for index in range(1_000):
        result = score(cheap[index % len(cheap)], world_copy)
        assert result["sql_execution"] == 0.0
    growth = rss_bytes() - before
    assert growth < 16 * 1024**2, f"parent RSS grew by {growth / 1024**2:.1f} MiB over 1,000 hostile calls"
    assert shared_pool().kills == 0


def test_workers_have_the_memory_limit_and_nothing_is_left_after_close(world_copy: Path) -> None:
    threads_before = set(threading.enumerate())
    pool = WorkerPool(TASKS_MODULE, size=1, memory_limit_bytes=512 * 1024**2, label="SQL")
    request = {"response": fenced("SELECT count(*) FROM city"), "db_path": str(world_copy), "timeout_s": 1.0}
    assert pool.call("check_response", {**request, "row_cap": 10}, 1.0)["rows"] == ((4079,),)
    seen = set(pool.worker_pids())
    assert len(seen) == 1
    for pid in seen:  # the worker has answered, so it set its limits
        limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
        assert any(line.startswith("Max address space") and "536870912" in line for line in limits)
        assert any(line.startswith("Max file size") and str(MAX_TEMP_FILE_BYTES) in line for line in limits)
        assert any(line.startswith("Max core file size") and " 0 " in line for line in limits)
    with pytest.raises(WorkerFailure, match="killed"):
        pool.call("check_response", {**request, "response": fenced(f"SELECT {PRINTF_BOMB}"), "row_cap": 10}, 0.5)
    assert pool.call("check_response", {**request, "row_cap": 10}, 1.0)["rows"] == ((4079,),)  # a fresh fork
    seen |= set(pool.worker_pids())
    assert len(seen) == 2 and pool.kills == 1
    pool.close()
    pool.close()  # idempotent
    assert [pid for pid in seen if process_exists(pid)] == []
    assert set(threading.enumerate()) == threads_before
    with pytest.raises(WorkerFailure, match="closed"):
        pool.call("table_definitions", {"db_path": str(world_copy)}, 1.0)


def test_calls_from_several_threads_share_the_pool(world_copy: Path) -> None:
    results: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(20):
            value = score(fenced("SELECT count(*) FROM city"), world_copy, sandbox_workers=3)["score"]
            with lock:
                results.append(float(value))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1.0] * 80
    assert len(shared_pool(size=3).worker_pids()) == 3


def test_a_forked_child_builds_its_own_pool_and_leaves_the_parents_alone(world_copy: Path) -> None:
    assert score(fenced("SELECT count(*) FROM city"), world_copy)["score"] == 1.0
    parent_workers = shared_pool().worker_pids()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            child_score = score(fenced("SELECT count(*) FROM city"), world_copy)["score"]
            child_workers = shared_pool().worker_pids()
            close_shared_pool()
            os.write(write_end, pickle.dumps((child_score, child_workers)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        child_score, child_workers = pickle.loads(reader.read())
    os.waitpid(child, 0)
    assert child_score == 1.0
    assert set(child_workers).isdisjoint(parent_workers)
    assert shared_pool().worker_pids() == parent_workers
    assert score(fenced("SELECT count(*) FROM city"), world_copy)["score"] == 1.0


def test_inprocess_isolation_gives_the_same_scores_for_ordinary_answers(world_copy: Path) -> None:
    for sql in ["SELECT count(*) FROM city", "SELECT count(*) FROM country", "SELECT nme FROM city", "DROP TABLE city"]:
        isolated = score(fenced(sql), world_copy)
        in_process = score(fenced(sql), world_copy, isolation="inprocess")
        assert isolated == in_process
    with pytest.raises(RewardConfigError, match="isolation"):
        Isolation("thread")
    # A refused setting is configuration, not a response's doing: the totality wrapper raises it.
    with pytest.raises(RewardConfigError, match="unknown text-to-SQL isolation 'thread'"):
        score(fenced("SELECT 1"), world_copy, isolation="thread")


def test_replies_may_hold_plain_data_only() -> None:
    assert decode_body(pickle.dumps(("ok", {"rows": ((1, "a", b"b", None, 2.5),)}))) == (
        "ok",
        {"rows": ((1, "a", b"b", None, 2.5),)},
    )
    with pytest.raises(pickle.UnpicklingError, match="plain data only"):
        decode_body(pickle.dumps(("ok", os.system)))


def process_gone(pid: int) -> bool:
    """True once a process has exited (a zombie waiting for its new parent to reap it counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_workers_exit_when_their_parent_dies_without_closing_the_pool() -> None:
    # As when a Ray actor is killed: no atexit, no close(); the workers see their input close, the zygote its socket.
    script = (
        "import os, sys\n"
        "from reward_fns.process_pool.pool import shared_pool\n"
        "pool = shared_pool('reward_fns.text_to_sql.sql_tasks')\n"
        f"pool.call('table_definitions', {{'db_path': {str(BUNDLED_DB_ROOT / 'singer.sqlite')!r}}}, 10.0)\n"
        "print(' '.join(map(str, [*pool.worker_pids(), pool.zygote_pid()])), flush=True)\n"
        "os._exit(0)\n"
    )
    finished = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    pids = [int(pid) for pid in finished.stdout.split()]
    assert len(pids) == 2  # the worker and the zygote that forked it
    give_up = time.monotonic() + 10.0
    while not all(process_gone(pid) for pid in pids) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert all(process_gone(pid) for pid in pids)

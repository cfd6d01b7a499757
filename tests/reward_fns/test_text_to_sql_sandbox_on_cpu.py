"""The SQLite sandbox: hostile SQL changes no file, never outlives its deadline, and scores 0."""

from __future__ import annotations

import hashlib
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reward_fns.text_to_sql import BUNDLED_DB_ROOT, compute_score
from reward_fns.text_to_sql.sandbox import QueryError, ReadOnlyDatabase, database_for_thread

# Bounds on wall or CPU time: run alone, after the two-worker part of `make test` (Makefile).
pytestmark = pytest.mark.serial

DEADLINE_S = 0.5
# Slack for scheduling on a busy 2-core machine; the interrupt itself lands within milliseconds.
DEADLINE_MARGIN_S = 0.5
# Deadline for statements that a cap (not the clock) must stop.
CAP_CASE_DEADLINE_S = 20.0

# Each statement would change the database, escape it, or run without end.
# The ATTACH target is created relative to the test's temporary folder (see `hostile_sql`).
HOSTILE_STATEMENTS = {
    "drop-table": "DROP TABLE city",
    "delete": "DELETE FROM city",
    "insert": "INSERT INTO city (Name) VALUES ('Atlantis')",
    "update": "UPDATE city SET Population = 0",
    "attach": "ATTACH DATABASE '{tmp}/attached.sqlite' AS other",
    "load-extension": "SELECT load_extension('{tmp}/evil.so')",
    "pragma-journal-mode": "PRAGMA journal_mode=WAL",
    "pragma-user-version": "PRAGMA user_version=5",
    "create-temp-table": "CREATE TEMP TABLE scratch AS SELECT * FROM city",
    "vacuum-into": "VACUUM INTO '{tmp}/copy.sqlite'",
    "endless-recursive-cte": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
    "huge-cross-join-aggregate": "SELECT count(*) FROM city AS a, city AS b, city AS c",
    "huge-cross-join-rows": "SELECT * FROM city AS a, city AS b",
    "multiple-statements": "SELECT 1; DROP TABLE city",
    "huge-blob": "SELECT zeroblob(900000) FROM city",
    # 64 rows of 32 values of ~1 MB: 2 GB if fetched in batches before the byte cap is checked.
    "wide-zeroblob-rows": "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i<64) SELECT "
    + ", ".join(["zeroblob(999999)"] * 32)
    + " FROM r",
}
# Statements that are queries in form, so they pass the format check; the others fail it.
FORMALLY_VALID_QUERIES = {
    "load-extension",
    "endless-recursive-cte",
    "huge-cross-join-aggregate",
    "huge-cross-join-rows",
    "huge-blob",
    "wide-zeroblob-rows",
}


def fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file in a folder, so any change or new file shows."""
    return {
        path.name: (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        for path in sorted(folder.iterdir())
    }


@pytest.fixture
def world_copy(tmp_path: Path) -> Iterator[Path]:
    """A private copy of world_1 (4079 cities, enough for expensive joins) in its own folder."""
    folder = tmp_path / "db"
    folder.mkdir()
    copy = folder / "world_1.sqlite"
    shutil.copyfile(BUNDLED_DB_ROOT / "world_1.sqlite", copy)
    yield copy


def hostile_sql(name: str, tmp_path: Path) -> str:
    return HOSTILE_STATEMENTS[name].format(tmp=tmp_path)


@pytest.mark.parametrize("name", sorted(HOSTILE_STATEMENTS))
def test_sandbox_refuses_hostile_sql_quickly_and_changes_nothing(name: str, world_copy: Path, tmp_path: Path) -> None:
    before = fingerprint(world_copy.parent)
    database = ReadOnlyDatabase(world_copy)
    started = time.monotonic()
    with pytest.raises(QueryError):
        database.execute(hostile_sql(name, tmp_path), timeout_s=DEADLINE_S)
    elapsed = time.monotonic() - started
    # The connection still works and still sees the data intact.
    assert database.execute("SELECT count(*) FROM city").rows == ((4079,),)
    database.close()
    assert elapsed < DEADLINE_S + DEADLINE_MARGIN_S
    assert fingerprint(world_copy.parent) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["db"]


@pytest.mark.parametrize("name", sorted(HOSTILE_STATEMENTS))
def test_hostile_responses_score_zero_for_execution(name: str, world_copy: Path, tmp_path: Path) -> None:
    ground_truth = {"sql": "SELECT count(*) FROM city", "db_path": str(world_copy)}
    response = f"```sql\n{hostile_sql(name, tmp_path)}\n```"
    compute_score("spider", "warm the gold cache", ground_truth, timeout_s=DEADLINE_S)
    before = fingerprint(world_copy.parent)
    started = time.monotonic()
    result = compute_score("spider", response, ground_truth, timeout_s=DEADLINE_S)
    elapsed = time.monotonic() - started
    assert elapsed < DEADLINE_S + DEADLINE_MARGIN_S
    assert fingerprint(world_copy.parent) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["db"]
    assert result["sql_executability"] == 0.0
    assert result["sql_execution"] == 0.0
    if name in FORMALLY_VALID_QUERIES:
        assert result["sql_format"] == 1.0
        assert "Execution error:" in str(result["sql_executability_info"])
    else:
        assert result["score"] == 0.0
        assert "Not executed" in str(result["sql_executability_info"])


@pytest.mark.parametrize(
    ("name", "kind", "message"),
    [
        ("drop-table", "denied", "not allowed in the read-only sandbox"),
        ("attach", "denied", "ATTACH"),
        ("load-extension", "denied", "load_extension"),
        ("pragma-journal-mode", "denied", "PRAGMA journal_mode"),
        ("pragma-user-version", "denied", "PRAGMA user_version"),
        ("endless-recursive-cte", "timeout", "timed out after 0.5 s"),
        ("huge-cross-join-aggregate", "timeout", "timed out"),
        ("huge-cross-join-rows", "too_many_rows", "too many rows"),
        ("multiple-statements", "sqlite", "one statement at a time"),
        ("huge-blob", "result_too_large", "result too large"),
        ("wide-zeroblob-rows", "result_too_large", "result too large"),
    ],
)
def test_refusals_say_why(name: str, kind: str, message: str, world_copy: Path, tmp_path: Path) -> None:
    # A cap refusal (rows, bytes) is reached in milliseconds, but a busy CI machine can deschedule the
    # process for longer than the short deadline; those cases get a deadline that only a hang reaches.
    timeout_s = DEADLINE_S if kind == "timeout" else CAP_CASE_DEADLINE_S
    database = ReadOnlyDatabase(world_copy)
    with pytest.raises(QueryError, match=re.escape(message)) as caught:
        database.execute(hostile_sql(name, tmp_path), timeout_s=timeout_s)
    assert caught.value.kind == kind
    database.close()


@pytest.mark.parametrize(
    "name", ["delete", "insert", "update", "attach", "vacuum-into", "pragma-user-version", "create-temp-table"]
)
def test_writes_fail_even_without_the_authorizer(name: str, world_copy: Path, tmp_path: Path) -> None:
    # White-box check of defence in depth: the read-only open, query_only and the
    # attach limit must stop writes on their own, should the authorizer ever let one through.
    before = fingerprint(world_copy.parent)
    database = ReadOnlyDatabase(world_copy)
    database._connection.set_authorizer(None)
    with pytest.raises(QueryError) as caught:
        database.execute(hostile_sql(name, tmp_path))
    database.close()
    assert caught.value.kind == "sqlite"
    assert fingerprint(world_copy.parent) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["db"]


def test_deadline_interrupts_close_to_the_deadline(world_copy: Path) -> None:
    database = ReadOnlyDatabase(world_copy)
    threads_before = threading.active_count()
    started = time.monotonic()
    with pytest.raises(QueryError, match="timed out"):
        database.execute(HOSTILE_STATEMENTS["endless-recursive-cte"], timeout_s=DEADLINE_S)
    elapsed = time.monotonic() - started
    assert DEADLINE_S <= elapsed < DEADLINE_S + DEADLINE_MARGIN_S
    # No thread was started to enforce the deadline, and none is left behind.
    assert threading.active_count() == threads_before
    database.close()


def test_row_cap_counts_rows_exactly(world_copy: Path) -> None:
    database = ReadOnlyDatabase(world_copy)
    assert len(database.execute("SELECT id FROM city LIMIT 100", row_cap=100).rows) == 100
    with pytest.raises(QueryError, match="more than 100 rows"):
        database.execute("SELECT id FROM city LIMIT 101", row_cap=100)
    database.close()


def test_values_longer_than_the_length_limit_are_refused(world_copy: Path) -> None:
    database = ReadOnlyDatabase(world_copy)
    with pytest.raises(QueryError, match="too big"):
        database.execute("SELECT zeroblob(2000000)")
    database.close()


def test_missing_database_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.sqlite"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        ReadOnlyDatabase(missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        database_for_thread(missing)


def test_connections_are_reused_per_thread_and_renewed_when_the_file_changes(world_copy: Path) -> None:
    first = database_for_thread(world_copy)
    assert database_for_thread(world_copy) is first
    from_other_thread: list[ReadOnlyDatabase] = []
    worker = threading.Thread(target=lambda: from_other_thread.append(database_for_thread(world_copy)))
    worker.start()
    worker.join()
    assert from_other_thread[0] is not first
    # Replace the file (new inode): the cached connection must not keep serving the old one.
    replacement = world_copy.with_suffix(".new")
    shutil.copyfile(BUNDLED_DB_ROOT / "concert_singer.sqlite", replacement)
    replacement.replace(world_copy)
    renewed = database_for_thread(world_copy)
    assert renewed is not first
    assert "singer" in renewed.table_definitions()

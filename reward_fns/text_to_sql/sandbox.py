"""Runs untrusted SQL against an SQLite database without letting it change anything.

Several independent layers, so that no single mistake lets a write through
(the tests check that writes fail even with the authorizer switched off):

* the file is opened read-only (``file:PATH?mode=ro`` URI) and the connection
  is put in ``PRAGMA query_only=1``;
* an authorizer (``set_authorizer``) allows only reading: SELECT, reading
  columns, recursive CTEs and ordinary functions. Writes, schema changes,
  ATTACH/DETACH, PRAGMA, transactions and dangerous functions such as
  ``load_extension`` are refused when the statement is prepared, before it runs;
* extension loading is switched off and at most 0 databases may be attached
  (``SQLITE_LIMIT_ATTACHED``), which also stops ``VACUUM INTO``;
* a wall-clock deadline interrupts the query from inside SQLite
  (``set_progress_handler`` returns non-zero once the deadline has passed), so
  no thread is left running;
* the result is fetched row by row and refused past a row cap and a byte cap,
  and single values are capped by ``SQLITE_LIMIT_LENGTH``.

These guards run inside the process that executes the query. Some costs they
cannot see (SQLite can spend seconds, or gigabytes, inside one instruction, e.g.
``printf('%.*c', 2147483647, 'x')``), so `compute_score` runs them in worker
processes with an address-space limit and a deadline their parent enforces
(``reward_fns.process_pool``).

Connections are reused per thread (SQLite connections must stay on the thread
that made them), which keeps scoring a batch cheap.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_ROW_CAP = 10_000
# Largest string or blob SQLite may build; keeps zeroblob()/printf() bombs small.
MAX_VALUE_BYTES = 1_000_000
# Largest total size of the text and blob values of one result.
MAX_RESULT_BYTES = 32_000_000
MAX_OPEN_DATABASES_PER_THREAD = 16

# SQLite calls the progress handler every this many virtual-machine instructions:
# often enough to stop within milliseconds of the deadline, rarely enough to cost little.
_PROGRESS_INTERVAL_INSTRUCTIONS = 1_000

# Functions refused even inside a SELECT. Only load_extension and fts3_tokenizer
# exist in the library; the others are SQLite shell helpers, listed in case the
# interpreter's SQLite was built with them.
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})

_ALLOWED_ACTIONS = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)

# Authorizer action codes by name, for readable refusals. Built from an explicit
# list because the sqlite3 module's result-code constants share the same numbers.
_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name
    for name in (
        "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
        "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
        "DROP_VIEW", "INSERT", "PRAGMA", "READ", "SELECT", "TRANSACTION", "UPDATE", "ATTACH", "DETACH",
        "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT",
        "RECURSIVE",
    )
    if hasattr(sqlite3, f"SQLITE_{name}")
}  # fmt: skip


class QueryError(Exception):
    """A query could not be run to completion; the message is meant for the verifier info.

    Attributes:
        kind: A short machine-readable cause: "denied", "timeout", "too_many_rows",
            "result_too_large", "encoding", "memory" or "sqlite" (any error SQLite itself
            reports); ``reward_fns.process_pool`` adds "killed" (the worker overran its deadline or died).
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class QueryResult:
    """The full result of a query.

    Attributes:
        columns: The column names, as SQLite reports them.
        rows: The rows, each a tuple of Python values (int, float, str, bytes or None).
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def _value_size(value: Any) -> int:
    """Approximate bytes a result value takes; numbers and NULL count as 8."""
    return len(value) if isinstance(value, str | bytes) else 8


class ReadOnlyDatabase:
    """One sandboxed, read-only connection to an SQLite file.

    Not thread-safe: use it from the thread that created it (see `database_for_thread`).

    Args:
        db_path: Path of an existing SQLite database file.

    Raises:
        FileNotFoundError: If `db_path` is not an existing file.
    """

    def __init__(self, db_path: Path) -> None:
        if not db_path.is_file():
            raise FileNotFoundError(f"SQLite database not found: {db_path}")
        self.db_path = db_path
        self._refusals: list[str] = []
        self._table_definitions: dict[str, str] | None = None
        self._connection = sqlite3.connect(
            f"{db_path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None, check_same_thread=True
        )
        self._lock_down()

    def _lock_down(self) -> None:
        """Applies every restriction; the authorizer goes last so the PRAGMAs above it still run."""
        connection = self._connection
        # Python builds without extension support have no such method, and then no extensions at all.
        if hasattr(connection, "enable_load_extension"):
            connection.enable_load_extension(False)
        connection.execute("PRAGMA query_only = 1")
        # Functions with side effects may not run from inside the schema (views, triggers).
        connection.execute("PRAGMA trusted_schema = 0")
        connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        connection.set_authorizer(self._authorize)

    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, db_name: str | None, source: str | None
    ) -> int:
        """SQLite authorizer callback: allows reads only and remembers what it refused.

        For SQLITE_FUNCTION, `arg2` is the function's name; `db_name` and `source`
        (the schema and the view or trigger involved) do not change the decision.
        """
        denied_function = action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in DENIED_FUNCTIONS
        if action in _ALLOWED_ACTIONS and not denied_function:
            return sqlite3.SQLITE_OK
        target = " ".join(part for part in (arg1, arg2) if part)
        self._refusals.append(f"{_ACTION_NAMES.get(action, f'action {action}')} {target}".strip())
        return sqlite3.SQLITE_DENY

    def execute(self, sql: str, *, timeout_s: float = DEFAULT_TIMEOUT_S, row_cap: int = DEFAULT_ROW_CAP) -> QueryResult:
        """Runs one statement and fetches its whole result.

        Args:
            sql: One SQL statement (SQLite itself refuses several).
            timeout_s: Wall-clock budget for preparing, running and fetching.
            row_cap: Most rows the result may have.

        Returns:
            The columns and rows.

        Raises:
            QueryError: If the statement is refused, errs, runs out of time, or its result is too big.
        """
        deadline = time.monotonic() + timeout_s
        deadline_passed = False

        def interrupt_after_deadline() -> int:
            nonlocal deadline_passed
            deadline_passed = time.monotonic() >= deadline
            return 1 if deadline_passed else 0

        self._refusals.clear()
        self._connection.set_progress_handler(interrupt_after_deadline, _PROGRESS_INTERVAL_INSTRUCTIONS)
        cursor: sqlite3.Cursor | None = None
        try:
            cursor = self._connection.execute(sql)
            columns = tuple(description[0] for description in cursor.description or ())
            rows = _fetch_within_caps(cursor, row_cap)
        except (sqlite3.Error, sqlite3.Warning) as error:
            raise self._explain(error, deadline_passed, timeout_s) from error
        except UnicodeEncodeError as error:  # a lone surrogate: sqlite3 passes SQL on as UTF-8
            raise QueryError("encoding", f"the SQL is not valid Unicode text: {error.reason}") from error
        except MemoryError as error:  # the worker's address-space limit (or a tiny machine)
            raise QueryError("memory", "the query ran out of memory") from error
        finally:
            if cursor is not None:
                cursor.close()
            self._connection.set_progress_handler(None, 0)
        return QueryResult(columns=columns, rows=rows)

    def _explain(self, error: Exception, deadline_passed: bool, timeout_s: float) -> QueryError:
        """Turns an sqlite3 exception into a QueryError with a message that says why."""
        if deadline_passed:
            return QueryError("timeout", f"query timed out after {timeout_s:g} s and was interrupted")
        if self._refusals:
            refused = "; ".join(dict.fromkeys(self._refusals))
            return QueryError("denied", f"not allowed in the read-only sandbox ({refused}): {error}")
        return QueryError("sqlite", f"{type(error).__name__}: {error}")

    def table_definitions(self) -> dict[str, str]:
        """The CREATE statements of the database's tables and views, by name, in schema order.

        Returns:
            A mapping from table name (original casing) to its CREATE statement.
        """
        if self._table_definitions is None:
            result = self.execute(
                "SELECT name, sql FROM sqlite_master "
                "WHERE type IN ('table', 'view') AND sql IS NOT NULL AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
            )
            self._table_definitions = {name: sql for name, sql in result.rows}
        return self._table_definitions

    def close(self) -> None:
        """Closes the connection."""
        self._connection.close()


def _fetch_within_caps(cursor: sqlite3.Cursor, row_cap: int) -> tuple[tuple[Any, ...], ...]:
    """Fetches a cursor's rows, stopping as soon as a cap is passed.

    Args:
        cursor: A cursor whose statement has just been executed.
        row_cap: Most rows allowed.

    Returns:
        All rows.

    Raises:
        QueryError: If there are more than `row_cap` rows or more than `MAX_RESULT_BYTES` of values.
    """
    # Row by row: one row may already hold many values of MAX_VALUE_BYTES each, so a
    # batch of rows could pass the byte cap many times over before it is checked.
    rows: list[tuple[Any, ...]] = []
    result_bytes = 0
    for row in cursor:
        rows.append(row)
        if len(rows) > row_cap:
            raise QueryError("too_many_rows", f"too many rows: the result has more than {row_cap} rows")
        result_bytes += sum(_value_size(value) for value in row)
        if result_bytes > MAX_RESULT_BYTES:
            raise QueryError("result_too_large", f"result too large: more than {MAX_RESULT_BYTES} bytes of values")
    return tuple(rows)


def file_signature(db_path: Path) -> tuple[int, int, int]:
    """Identifies one version of a file (inode, size, modification time), so caches notice a replaced file.

    Args:
        db_path: An existing file.

    Returns:
        (inode, size in bytes, mtime in nanoseconds).

    Raises:
        FileNotFoundError: If the file does not exist.
    """
    try:
        status = os.stat(db_path)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"SQLite database not found: {db_path}") from error
    return status.st_ino, status.st_size, status.st_mtime_ns


_per_thread = threading.local()


def database_for_thread(db_path: Path) -> ReadOnlyDatabase:
    """Returns this thread's open sandboxed connection to a database, opening it if needed.

    Each thread keeps at most `MAX_OPEN_DATABASES_PER_THREAD` connections (least
    recently used closed first) and reopens a file that changed on disk.

    Args:
        db_path: Path of an SQLite database file.

    Returns:
        The connection wrapper.

    Raises:
        FileNotFoundError: If `db_path` does not exist.
    """
    databases: OrderedDict[Path, tuple[tuple[int, int, int], ReadOnlyDatabase]]
    databases = _per_thread.__dict__.setdefault("databases", OrderedDict())
    db_path = db_path.resolve()
    signature = file_signature(db_path)
    cached = databases.pop(db_path, None)
    if cached is not None:
        cached_signature, database = cached
        if cached_signature == signature:
            databases[db_path] = cached
            return database
        database.close()
    database = ReadOnlyDatabase(db_path)
    databases[db_path] = (signature, database)
    while len(databases) > MAX_OPEN_DATABASES_PER_THREAD:
        _, (_, evicted) = databases.popitem(last=False)
        evicted.close()
    return database

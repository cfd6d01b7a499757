"""The work that touches untrusted SQL: format check, parsing and execution, as plain-data tasks.

Each task takes and returns only plain data (str, int, float, bytes, None, lists,
tuples, dicts), so that it can run in a sandbox worker process (``reward_fns.process_pool.worker``)
and send its answer back through a pipe that the parent reads without
unpickling any class (see ``reward_fns.process_pool``). The same functions run in-process
when `compute_score(isolation="inprocess")` is asked for (for comparison only).

Tasks, by name (`TASKS`):

* ``check_response``: the response's format check (`parse.extract_query`, which
  also parses the query with sqlglot) and, when it passes, the query's result;
* ``run_gold``: a gold query's result and whether its row order matters;
* ``table_definitions``: the CREATE statements of a database's tables and views.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reward_fns.text_to_sql.parse import extract_query
from reward_fns.text_to_sql.sandbox import QueryError, QueryResult, database_for_thread
from reward_fns.text_to_sql.sql_analysis import query_orders_rows

# Least time left for executing a query once its response has been parsed.
_MIN_EXECUTION_S = 0.001


def _result_fields(result: QueryResult | None, error: QueryError | None) -> dict[str, Any]:
    """A query's outcome as plain data: columns and rows, or the error and its kind."""
    if error is not None:
        return {"columns": None, "rows": None, "error": str(error), "error_kind": error.kind}
    assert result is not None
    return {"columns": result.columns, "rows": result.rows, "error": None, "error_kind": None}


def _execute(db_path: str, sql: str, timeout_s: float, row_cap: int, deadline_s: float | None = None) -> dict[str, Any]:
    """Runs a query within `timeout_s`; a timeout names `deadline_s` (the whole task's deadline) when given."""
    try:
        result = database_for_thread(Path(db_path)).execute(sql, timeout_s=timeout_s, row_cap=row_cap)
    except QueryError as error:
        if error.kind == "timeout" and deadline_s is not None:
            error = QueryError(
                "timeout", f"query timed out after {deadline_s:g} s (parsing and running) and was interrupted"
            )
        return _result_fields(None, error)
    return _result_fields(result, None)


def check_response(response: str, db_path: str, timeout_s: float, row_cap: int) -> dict[str, Any]:
    """Checks a response's format and runs its query; parsing and running share `timeout_s`.

    Args:
        response: The model's response.
        db_path: The database file.
        timeout_s: Wall-clock budget for parsing and executing together.
        row_cap: Most rows the result may have.

    Returns:
        "sql" (the query or None), "problem" (why the format check failed, or None),
        "tables" (sorted lower-cased table names the query reads, or None), and the
        execution outcome: "columns", "rows", "error", "error_kind" (all None when not executed).
    """
    started = time.monotonic()
    extracted = extract_query(response)
    fields: dict[str, Any] = {
        "sql": extracted.sql,
        "problem": extracted.problem,
        "tables": sorted(extracted.tables) if extracted.tables is not None else None,
        "columns": None,
        "rows": None,
        "error": None,
        "error_kind": None,
    }
    if extracted.sql is not None:
        remaining = max(timeout_s - (time.monotonic() - started), _MIN_EXECUTION_S)
        fields.update(_execute(db_path, extracted.sql, remaining, row_cap, deadline_s=timeout_s))
    return fields


def run_gold(sql: str, db_path: str, timeout_s: float, row_cap: int) -> dict[str, Any]:
    """Runs a gold query.

    Returns:
        "columns", "rows", "error", "error_kind" as in `check_response`, and "orders_rows"
        (whether the gold query's outermost SELECT has an ORDER BY; False when it failed).
    """
    fields = _execute(db_path, sql, timeout_s, row_cap)
    fields["orders_rows"] = fields["error"] is None and query_orders_rows(sql)
    return fields


def table_definitions(db_path: str) -> dict[str, str]:
    """The CREATE statements of a database's tables and views, by name, in schema order."""
    return dict(database_for_thread(Path(db_path)).table_definitions())


TASKS: dict[str, Callable[..., Any]] = {
    "check_response": check_response,
    "run_gold": run_gold,
    "table_definitions": table_definitions,
}

"""The text-to-SQL reward: three components and their verifier information.

Components (each 0.0 or 1.0):

* ``sql_format``: the response has the expected format (`parse.EXPECTED_FORMAT`:
  exactly one ```sql fenced block holding exactly one query);
* ``sql_executability``: that query runs in the sandbox without error, within
  the deadline and the row cap. A response that fails the format check is not
  executed and scores 0 here;
* ``sql_execution``: its result equals the gold query's result (see `compare`).

``score`` is the unweighted mean of the three, so it lies in {0, 1/3, 2/3, 1}.

Everything that reads or runs the response's SQL (format check, sqlglot parse,
execution) runs in a sandbox worker process (``reward_fns.process_pool``, `isolation`) under the
response's deadline (`timeout_s`), and so does the gold query (`gold_timeout_s`); a
worker that overruns its deadline is killed and the response scores 0 with the
reason in every verifier information string.
Gold results and schemas are cached in the calling process, so each gold query
runs once per database file version.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_fns.process_pool.pool import DEFAULT_MEMORY_LIMIT_BYTES, DEFAULT_WORKERS, DeadlineExceeded, WorkerFailure
from reward_fns.text_to_sql.compare import SEMANTICS, Semantics, results_match
from reward_fns.text_to_sql.ground_truth import GoldQuery, choose_db_root, resolve_gold_query
from reward_fns.text_to_sql.isolation import Isolation
from reward_fns.text_to_sql.parse import EXPECTED_FORMAT, ExtractedQuery
from reward_fns.text_to_sql.sandbox import DEFAULT_ROW_CAP, DEFAULT_TIMEOUT_S, QueryResult, file_signature
from reward_fns.total import RewardConfigError, timeouts_key, total_over_responses

logger = logging.getLogger(__name__)

REWARD_KEYS: tuple[str, ...] = ("sql_format", "sql_executability", "sql_execution")

# Gold queries run once per (database, query) thanks to the cache, so they get a
# longer deadline than predictions: some BIRD gold queries take seconds.
DEFAULT_GOLD_TIMEOUT_S = 30.0
# Reading a schema is one small query on sqlite_master.
_SCHEMA_TIMEOUT_S = 10.0
# Most characters of one info string's main part (schema or gold result).
DEFAULT_INFO_CHAR_LIMIT = 3_000
GOLD_CACHE_SIZE = 4_096
_GOLD_ROWS_SHOWN = 20
_ERROR_CHAR_LIMIT = 500
_TRUNCATION_MARK = " ...[truncated]"
_DEFAULT_ISOLATION = Isolation()


@dataclass(frozen=True)
class GoldOutcome:
    """What running the gold query gave.

    Attributes:
        result: The gold result, or None if the gold query failed.
        error: Why the gold query failed, or None.
        orders_rows: Whether the gold query's outermost SELECT has an ORDER BY.
    """

    result: QueryResult | None
    error: str | None
    orders_rows: bool


def _query_result(fields: Mapping[str, Any]) -> QueryResult | None:
    """A task's result fields as a QueryResult, or None when the query failed."""
    if fields["error"] is not None:
        return None
    return QueryResult(columns=tuple(fields["columns"]), rows=tuple(tuple(row) for row in fields["rows"]))


@functools.lru_cache(maxsize=GOLD_CACHE_SIZE)
def _cached_gold_outcome(
    db_path: Path, signature: tuple[int, int, int], sql: str, timeout_s: float, row_cap: int, isolation: Isolation
) -> GoldOutcome:
    """Runs a gold query; cached by database path, file version and query (lru_cache is thread-safe).

    `signature` is only part of the cache key, so a database changed on disk is queried again.
    A killed worker raises `WorkerFailure`, which lru_cache does not keep: the next call tries again.
    """
    del signature
    fields = isolation.run(
        "run_gold", {"sql": sql, "db_path": str(db_path), "timeout_s": timeout_s, "row_cap": row_cap}, timeout_s
    )
    if fields["error"] is not None:
        logger.warning("text-to-SQL gold query failed on %s: %s | %s", db_path, fields["error"], sql)
        return GoldOutcome(result=None, error=fields["error"], orders_rows=False)
    return GoldOutcome(result=_query_result(fields), error=None, orders_rows=bool(fields["orders_rows"]))


def gold_outcome(
    gold: GoldQuery, *, timeout_s: float, row_cap: int, isolation: Isolation = _DEFAULT_ISOLATION
) -> GoldOutcome:
    """Returns the (cached) outcome of a gold query.

    Args:
        gold: The gold query and its database.
        timeout_s: Deadline for running it.
        row_cap: Most rows its result may have.
        isolation: Where the query runs.

    Returns:
        The gold result or its error.
    """
    signature = file_signature(gold.db_path)
    try:
        return _cached_gold_outcome(gold.db_path, signature, gold.sql, timeout_s, row_cap, isolation)
    except WorkerFailure as failure:
        logger.warning("text-to-SQL gold query failed on %s: %s | %s", gold.db_path, failure, gold.sql)
        return GoldOutcome(result=None, error=str(failure), orders_rows=False)


@functools.lru_cache(maxsize=GOLD_CACHE_SIZE)
def _cached_table_definitions(
    db_path: Path, signature: tuple[int, int, int], isolation: Isolation
) -> tuple[tuple[str, str], ...]:
    """The database's (name, CREATE statement) pairs; cached like the gold results."""
    del signature
    definitions = isolation.run("table_definitions", {"db_path": str(db_path)}, _SCHEMA_TIMEOUT_S)
    return tuple(definitions.items())


def clear_gold_cache() -> None:
    """Empties the gold-result and schema caches (for tests and long-lived workers)."""
    _cached_gold_outcome.cache_clear()
    _cached_table_definitions.cache_clear()


def _truncate(text: str, limit: int) -> str:
    """Cuts text to at most `limit` characters plus a visible mark."""
    return text if len(text) <= limit else text[:limit] + _TRUNCATION_MARK


def _semantics_for(data_source: str, requested: str | None) -> Semantics:
    """The comparison rule: the one requested, else BIRD's for BIRD data, else Spider's."""
    chosen = requested or ("bird" if data_source.lower().startswith("bird") else "spider")
    for semantics in SEMANTICS:
        if chosen == semantics:
            return semantics
    raise RewardConfigError(f"unknown text-to-SQL semantics {chosen!r}; expected one of {SEMANTICS}")


def _format_info(extracted: ExtractedQuery) -> str:
    """Verifier info for sql_format: the expected format and what the check found."""
    check = "passed" if extracted.format_ok else f"failed: {_truncate(extracted.problem or '', _ERROR_CHAR_LIMIT)}"
    return f"Expected format: {EXPECTED_FORMAT}\nCheck: {check}"


def _schema_text(gold: GoldQuery, isolation: Isolation, referenced: frozenset[str] | None, char_limit: int) -> str:
    """CREATE statements of the tables the prediction uses, or of all tables when that is unknown.

    The whole schema is shown when the query is missing or unparseable, or names a
    table the database lacks: then the model needs to see which tables do exist.
    """
    try:
        definitions = dict(_cached_table_definitions(gold.db_path, file_signature(gold.db_path), isolation))
    except WorkerFailure as failure:
        return f"Database schema unavailable: {_truncate(str(failure), _ERROR_CHAR_LIMIT)}"
    known_names = {name.lower() for name in definitions}
    if referenced and referenced <= known_names:
        header = "Schema of the tables the query uses:"
        chosen = [sql for name, sql in definitions.items() if name.lower() in referenced]
    else:
        header = "Database schema (all tables):"
        chosen = list(definitions.values())
    return header + "\n" + _truncate(";\n".join(chosen) + ";", char_limit)


def _executability_info(
    gold: GoldQuery, isolation: Isolation, extracted: ExtractedQuery, execution_error: str | None, char_limit: int
) -> str:
    """Verifier info for sql_executability: the relevant schema and the execution outcome."""
    schema = _schema_text(gold, isolation, extracted.tables, char_limit)
    if extracted.sql is None:
        outcome = f"Not executed: the response format check failed ({extracted.problem})."
    elif execution_error is not None:
        outcome = f"Execution error: {_truncate(execution_error, _ERROR_CHAR_LIMIT)}"
    else:
        outcome = "Execution: ran without error."
    return f"{schema}\n{outcome}"


def _render_result(result: QueryResult, char_limit: int) -> str:
    """Renders a result as a header line and one tuple per row, cut to the limit."""
    shown = [repr(row) for row in result.rows[:_GOLD_ROWS_SHOWN]]
    hidden = len(result.rows) - len(shown)
    if hidden:
        shown.append(f"... ({hidden} more rows)")
    return _truncate("\n".join(shown), char_limit)


@dataclass(frozen=True)
class _CheckedResponse:
    """The response's format check and execution, as the sandbox reported them.

    Attributes:
        extracted: The format check's outcome (with the tables the query reads).
        predicted: The query's result, or None when it was not run or failed.
        execution_error: Why the query failed, or None.
        sandbox_failure: Set when the sandbox could not finish (worker killed at the deadline
            or died); every component is then 0 and this text ends every info string.
    """

    extracted: ExtractedQuery
    predicted: QueryResult | None = None
    execution_error: str | None = None
    sandbox_failure: str | None = None
    timed_out: bool = False


def _check_response(
    solution_str: Any, gold: GoldQuery, isolation: Isolation, timeout_s: float, row_cap: int
) -> _CheckedResponse:
    """Checks the response's format and runs its query in the sandbox, under one deadline."""
    if not isinstance(solution_str, str):
        problem = f"the response is a {type(solution_str).__name__}, not text"
        return _CheckedResponse(ExtractedQuery(sql=None, problem=problem))
    request = {"response": solution_str, "db_path": str(gold.db_path), "timeout_s": timeout_s, "row_cap": row_cap}
    try:
        fields = isolation.run("check_response", request, timeout_s)
    except WorkerFailure as failure:
        reason = f"Sandbox: {_truncate(str(failure), _ERROR_CHAR_LIMIT)}; the response scores 0."
        return _CheckedResponse(
            ExtractedQuery(sql=None, problem="the sandbox could not finish checking the response"),
            sandbox_failure=reason,
            timed_out=isinstance(failure, DeadlineExceeded),
        )
    tables = frozenset(fields["tables"]) if fields["tables"] is not None else None
    return _CheckedResponse(
        ExtractedQuery(sql=fields["sql"], problem=fields["problem"], tables=tables),
        predicted=_query_result(fields) if fields["sql"] is not None else None,
        execution_error=fields["error"],
        timed_out=fields["error_kind"] == "timeout",  # SQLite's progress handler stopped it at the deadline
    )


def _execution_info(gold: GoldQuery, outcome: GoldOutcome, semantics: Semantics, char_limit: int) -> str:
    """Verifier info for sql_execution: the gold SQL and its (truncated) result."""
    lines = [f"Gold SQL: {gold.sql}"]
    if outcome.result is None:
        lines.append(f"Gold query failed: {_truncate(outcome.error or '', _ERROR_CHAR_LIMIT)}")
        return "\n".join(lines)
    result = outcome.result
    if semantics == "bird":
        rule = "compared as a set of rows"
    elif outcome.orders_rows:
        rule = "row order matters"
    else:
        rule = "row order ignored"
    lines.append(f"Gold result ({len(result.rows)} rows; columns: {', '.join(result.columns)}; {rule}):")
    lines.append(_render_result(result, char_limit))
    return "\n".join(lines)


def read_ground_truth(arguments: Mapping[str, Any]) -> GoldQuery:
    """The gold query of a ``compute_score`` call (its arguments by name); raises on a bad row or setting.

    A successful read of a JSON-text ground truth is cached (the same text comes with every
    response of a group); errors are not.
    """
    data_source, semantics = str(arguments.get("data_source", "")), arguments.get("semantics")
    db_root = choose_db_root(arguments.get("extra_info"), arguments.get("db_root"))
    ground_truth = arguments.get("ground_truth")
    if isinstance(ground_truth, str) and (semantics is None or isinstance(semantics, str)):
        return _read_gold_text(ground_truth, db_root, data_source, semantics)
    return _read_gold(ground_truth, db_root, data_source, semantics)


def _read_gold(ground_truth: Any, db_root: Path, data_source: str, semantics: Any) -> GoldQuery:
    # The comparison rule is configuration, but a wrong one must raise too, not score every response 0.
    _semantics_for(data_source, semantics)
    return resolve_gold_query(ground_truth, db_root)


_read_gold_text = functools.lru_cache(maxsize=GOLD_CACHE_SIZE)(_read_gold)


@total_over_responses("text_to_sql", read_ground_truth=read_ground_truth, reward_keys=lambda arguments: REWARD_KEYS)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    semantics: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    gold_timeout_s: float = DEFAULT_GOLD_TIMEOUT_S,
    row_cap: int = DEFAULT_ROW_CAP,
    db_root: str | Path | None = None,
    info_char_limit: int = DEFAULT_INFO_CHAR_LIMIT,
    isolation: str = "process",
    sandbox_workers: int = DEFAULT_WORKERS,
    sandbox_memory_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    **unused_kwargs: Any,
) -> dict[str, float | str]:
    """Scores one text-to-SQL response.

    Args:
        data_source: The sample's data source ("spider", "bird/dev", ...); "bird..." selects BIRD semantics
            unless `semantics` is given.
        solution_str: The model's response; see `parse.EXPECTED_FORMAT`.
        ground_truth: {"sql": ..., "db_id": ..., "db_path": optional} or its JSON string; see `ground_truth`.
        extra_info: The sample's extra_info; its "db_root" (if any) locates the databases.
        semantics: "spider" (bag of rows, ORDER BY-aware, column permutation allowed) or "bird" (set of rows).
        timeout_s: Wall-clock deadline for checking and running the predicted query (parse and execution
            together); its worker process is killed ``process_pool.pool.kill_grace(timeout_s)`` after it.
        gold_timeout_s: Wall-clock deadline for the gold query (run once, then cached).
        row_cap: Most rows a result may have; more is an error ("too many rows").
        db_root: Database root used when extra_info has none.
        info_char_limit: Most characters of the schema or gold-result part of an info string.
        isolation: "process" (sandbox worker processes; the default) or "inprocess" (SQLite's own guards
            only; for measuring the cost of isolation, never for training); see `isolation`.
        sandbox_workers: Worker processes of this process's pool (one pool per process; keep this and
            `sandbox_memory_bytes` the same for every call, since a call with other values replaces the pool).
        sandbox_memory_bytes: Address-space limit of each worker process.
        **unused_kwargs: Ignored; the reward loop may pass arguments meant for other reward functions.

    Returns:
        "score" (mean of the three components), "sql_format", "sql_executability", "sql_execution"
        (each 0.0 or 1.0) and one "<component>_info" string per component.

    Raises:
        RewardConfigError: If `semantics`, `isolation` or a sandbox setting is refused (raised through the
            totality wrapper, never scored as 0).
        ValueError: If the ground truth is malformed.
        FileNotFoundError: If the database file does not exist.
    """
    del unused_kwargs
    chosen_semantics = _semantics_for(data_source, semantics)
    chosen_isolation = Isolation(isolation, sandbox_workers, sandbox_memory_bytes)
    gold = resolve_gold_query(ground_truth, choose_db_root(extra_info, db_root))
    gold_result = gold_outcome(gold, timeout_s=gold_timeout_s, row_cap=row_cap, isolation=chosen_isolation)
    checked = _check_response(solution_str, gold, chosen_isolation, timeout_s, row_cap)
    predicted = checked.predicted

    matches = (
        predicted is not None
        and gold_result.result is not None
        and results_match(
            predicted, gold_result.result, semantics=chosen_semantics, gold_orders_rows=gold_result.orders_rows
        )
    )
    components = {
        "sql_format": 1.0 if checked.extracted.format_ok else 0.0,
        "sql_executability": 1.0 if predicted is not None else 0.0,
        "sql_execution": 1.0 if matches else 0.0,
    }
    infos = {
        "sql_format_info": _format_info(checked.extracted),
        "sql_executability_info": _executability_info(
            gold, chosen_isolation, checked.extracted, checked.execution_error, info_char_limit
        ),
        "sql_execution_info": _execution_info(gold, gold_result, chosen_semantics, info_char_limit),
    }
    if checked.sandbox_failure is not None:
        infos = {key: f"{info}\n{checked.sandbox_failure}" for key, info in infos.items()}
    scores: dict[str, float | str] = {"score": sum(components.values()) / len(components)}
    scores[timeouts_key("text_to_sql")] = 1.0 if checked.timed_out else 0.0
    for key in REWARD_KEYS:
        scores[key] = components[key]
        scores[f"{key}_info"] = infos[f"{key}_info"]
    return scores

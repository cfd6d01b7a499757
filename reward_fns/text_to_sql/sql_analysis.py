"""Static facts about SQL text, read with sqlglot's SQLite dialect.

Nothing here executes SQL. The verifier uses these helpers to count statements,
to tell a query from other statements, to decide whether the gold result's row
order is part of the answer, and to find which tables a predicted query names.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.errors import ParseError, SqlglotError

SQL_DIALECT = "sqlite"

# A statement is a query when its first token is one of these (SQLite's grammar
# for a select-stmt); anything else (DROP, PRAGMA, ATTACH, ...) is not a query.
_QUERY_LEADING_TOKENS = frozenset({TokenType.SELECT, TokenType.WITH, TokenType.VALUES})


class SqlTokenizeError(ValueError):
    """Raised when SQL text cannot even be split into tokens (e.g. an unterminated string)."""


@dataclass(frozen=True)
class QueryShape:
    """What sqlglot's parse of one statement says about it.

    Attributes:
        problem: Why the statement is not one read-only query (unparseable, too deeply
            nested for the parser, or another kind of statement), or None when it is one.
        tables: Lower-cased names of the database tables it reads (its own CTE names left out);
            None when `problem` is set.
        orders_rows: Whether its outermost SELECT (or compound SELECT) has an ORDER BY.
    """

    problem: str | None
    tables: frozenset[str] | None = None
    orders_rows: bool = False


# What counts as one read-only query: a SELECT (with or without WITH), a compound SELECT
# (UNION, INTERSECT, EXCEPT) or a VALUES list. sqlglot puts a leading WITH on the statement
# that follows it, so ``WITH x AS (...) DELETE ...`` is a Delete.
_QUERY_EXPRESSIONS = (exp.Select, exp.SetOperation, exp.Values)


def _parse_error_text(error: SqlglotError) -> str:
    """A parse error's first description and position, without sqlglot's terminal colour codes."""
    details = error.errors[0] if isinstance(error, ParseError) and error.errors else None
    if not details:
        return str(error).split("\n")[0]
    return f"{details.get('description')} (line {details.get('line')}, column {details.get('col')})"


def _statement_name(expression: exp.Expr) -> str:
    """An upper-case name for a parsed statement, e.g. DELETE or COMMAND (EXPLAIN ...)."""
    if isinstance(expression, exp.Command):
        return f"{str(expression.this).upper()} (parsed as an opaque command)"
    return type(expression).__name__.upper()


def shape_of_statement(statement_tokens: list[Token], sql: str) -> QueryShape:
    """Parses one statement's tokens and says whether it is exactly one read-only query.

    Args:
        statement_tokens: The tokens of one statement, as returned by `split_statements`.
        sql: The text the tokens came from (for sqlglot's error messages).

    Returns:
        The shape; `problem` is set when sqlglot cannot parse the statement, when the
        parser's recursion runs out (deeply nested input), or when it is not a query.
    """
    try:
        parsed = sqlglot.Dialect.get_or_raise(SQL_DIALECT).parser().parse(statement_tokens, sql)
    except SqlglotError as error:
        return QueryShape(problem=f"sqlglot cannot parse the query: {_parse_error_text(error)}")
    except RecursionError:
        return QueryShape(problem="the query is nested too deeply for the SQL parser")
    expressions = [expression for expression in parsed if expression is not None]
    if len(expressions) != 1:
        return QueryShape(problem=f"sqlglot reads {len(expressions)} statements; expected exactly one query")
    statement = expressions[0]
    if not isinstance(statement, _QUERY_EXPRESSIONS):
        return QueryShape(problem=f"the statement is a {_statement_name(statement)}; expected a SELECT query")
    try:
        tables = frozenset(_tables_read(statement))
    except RecursionError:
        return QueryShape(problem="the query is nested too deeply for the SQL parser")
    return QueryShape(problem=None, tables=tables, orders_rows=statement.args.get("order") is not None)


def _tables_read(parsed: exp.Expr) -> set[str]:
    """Lower-cased names of the tables a parsed query reads, its own CTE names left out."""
    cte_names = {cte.alias_or_name.lower() for cte in parsed.find_all(exp.CTE)}
    table_names = {table.name.lower() for table in parsed.find_all(exp.Table) if table.name}
    return table_names - cte_names


def _tokenize(sql: str) -> list[Token]:
    """Tokenizes SQL with sqlglot, dropping comments.

    Args:
        sql: SQL text, possibly several statements.

    Returns:
        The tokens in order.

    Raises:
        SqlTokenizeError: If sqlglot cannot tokenize the text.
    """
    try:
        return sqlglot.tokenize(sql, read=SQL_DIALECT)
    except SqlglotError as error:
        raise SqlTokenizeError(str(error)) from error


def split_statements(sql: str) -> list[list[Token]]:
    """Splits SQL into statements at top-level semicolons.

    Tokenizing (rather than searching for ';') keeps semicolons inside string
    literals, quoted names and comments from counting as separators. Empty
    statements (``;;`` or a trailing ``;``) are dropped.

    Args:
        sql: SQL text.

    Returns:
        One token list per non-empty statement.

    Raises:
        SqlTokenizeError: If sqlglot cannot tokenize the text.
    """
    statements: list[list[Token]] = [[]]
    for token in _tokenize(sql):
        if token.token_type == TokenType.SEMICOLON:
            statements.append([])
        else:
            statements[-1].append(token)
    return [statement for statement in statements if statement]


def is_query_statement(statement_tokens: list[Token]) -> bool:
    """Tells whether a statement is a query (SELECT, WITH ... SELECT or VALUES).

    Args:
        statement_tokens: The tokens of one statement, as returned by `split_statements`.

    Returns:
        True when the statement starts like an SQLite select-stmt.
    """
    return bool(statement_tokens) and statement_tokens[0].token_type in _QUERY_LEADING_TOKENS


def _parse_single(sql: str) -> exp.Expr | None:
    """Parses one statement, or returns None if sqlglot cannot parse it."""
    try:
        expressions = sqlglot.parse(sql, read=SQL_DIALECT)
    except (SqlglotError, RecursionError):
        return None
    parsed = [expression for expression in expressions if expression is not None]
    return parsed[0] if len(parsed) == 1 else None


def _has_top_level_order_by_tokens(sql: str) -> bool:
    """Fallback for SQL sqlglot cannot parse: looks for ORDER BY outside any parentheses."""
    depth = 0
    for token in _tokenize(sql):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
        elif token.token_type == TokenType.ORDER_BY and depth == 0:
            return True
    return False


def query_orders_rows(sql: str) -> bool:
    """Tells whether a query's outermost SELECT (or compound SELECT) has an ORDER BY.

    Only the outermost ORDER BY fixes the order of the result; one inside a
    subquery, a CTE or a window does not, so a plain text search would be wrong
    for queries such as ``... WHERE id = (SELECT id ... ORDER BY x LIMIT 1)``.

    Args:
        sql: One SQL query.

    Returns:
        True when the result's row order is defined by the query.
    """
    parsed = _parse_single(sql)
    if parsed is None:
        try:
            return _has_top_level_order_by_tokens(sql)
        except SqlTokenizeError:
            return False
    return parsed.args.get("order") is not None


def referenced_table_names(sql: str) -> set[str] | None:
    """Names of the database tables a query reads, lower-cased.

    Names defined by the query's own CTEs are left out, since they are not
    tables of the database.

    Args:
        sql: One SQL query.

    Returns:
        The lower-cased table names, or None when sqlglot cannot parse the query.
    """
    parsed = _parse_single(sql)
    return None if parsed is None else _tables_read(parsed)

"""Static facts about SQL text, read with sqlglot's SQLite dialect.

Nothing here executes SQL. The verifier uses these helpers to count statements,
to tell a query from other statements, to decide whether the gold result's row
order is part of the answer, and to find which tables a predicted query names.
"""

from __future__ import annotations

import sqlglot
from sqlglot import Token, TokenType, exp
from sqlglot.errors import SqlglotError

SQL_DIALECT = "sqlite"

# A statement is a query when its first token is one of these (SQLite's grammar
# for a select-stmt); anything else (DROP, PRAGMA, ATTACH, ...) is not a query.
_QUERY_LEADING_TOKENS = frozenset({TokenType.SELECT, TokenType.WITH, TokenType.VALUES})


class SqlTokenizeError(ValueError):
    """Raised when SQL text cannot even be split into tokens (e.g. an unterminated string)."""


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
    except SqlglotError:
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
    if parsed is None:
        return None
    cte_names = {cte.alias_or_name.lower() for cte in parsed.find_all(exp.CTE)}
    table_names = {table.name.lower() for table in parsed.find_all(exp.Table) if table.name}
    return table_names - cte_names

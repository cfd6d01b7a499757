"""Cheap checks that run before any parser sees a response: size, encoding and nesting depth.

sqlglot's parser takes time linear in the bytes and recurses once per nesting level
(46 nested parentheses exhaust Python's recursion limit), so a response is
refused, with the reason, when

* it is longer than `MAX_RESPONSE_BYTES` (64 KiB of UTF-8), or its SQL block
  longer than `MAX_SQL_BYTES` (the same 64 KiB);
* it cannot be encoded as UTF-8 (a lone surrogate: SQLite would raise
  `UnicodeEncodeError`);
* its SQL nests parentheses deeper than `MAX_PAREN_DEPTH`. The scan counts
  every parenthesis, including those inside string literals and comments, so
  it over-counts only for text no real query holds (dozens of unbalanced
  parentheses inside a literal). Nesting without parentheses (``NOT NOT ...``,
  ``CASE WHEN CASE WHEN ...``) is caught by the parser's own `RecursionError`
  handling in `sql_analysis`, and the parser runs in the sandbox worker under
  the query's deadline.

The deepest gold query of the bundled Spider dev subset nests 4 levels.
"""

from __future__ import annotations

MAX_RESPONSE_BYTES = 64 * 1024
MAX_SQL_BYTES = 64 * 1024
MAX_PAREN_DEPTH = 32


def response_problem(response: str) -> str | None:
    """Why a response is refused before parsing, or None when it may be parsed.

    Args:
        response: The model's response text (any str, any size).

    Returns:
        A message for the verifier info, or None.
    """
    # len() first: a 100 MB response is refused without encoding it.
    if len(response) > MAX_RESPONSE_BYTES:
        return f"the response is {len(response)} characters long; responses over {MAX_RESPONSE_BYTES} bytes are refused"
    try:
        size = len(response.encode("utf-8"))
    except UnicodeEncodeError as error:
        return f"the response is not valid Unicode text (a lone surrogate at character {error.start})"
    if size > MAX_RESPONSE_BYTES:
        return f"the response is {size} bytes of UTF-8; responses over {MAX_RESPONSE_BYTES} bytes are refused"
    return None


def sql_problem(sql: str) -> str | None:
    """Why an SQL text is refused before parsing or execution, or None when it may go on.

    Args:
        sql: The text of the ```sql block (or a gold query).

    Returns:
        A message for the verifier info, or None.
    """
    if len(sql) > MAX_SQL_BYTES:
        return f"the SQL is {len(sql)} characters long; SQL over {MAX_SQL_BYTES} bytes is refused"
    try:
        size = len(sql.encode("utf-8"))
    except UnicodeEncodeError as error:
        return f"the SQL is not valid Unicode text (a lone surrogate at character {error.start})"
    if size > MAX_SQL_BYTES:
        return f"the SQL is {size} bytes of UTF-8; SQL over {MAX_SQL_BYTES} bytes is refused"
    depth = paren_depth(sql)
    if depth > MAX_PAREN_DEPTH:
        return f"the SQL nests parentheses {depth} levels deep; more than {MAX_PAREN_DEPTH} levels are refused"
    return None


def paren_depth(text: str) -> int:
    """Deepest nesting of parentheses in a text (a ')' without its '(' counts as closing nothing).

    Args:
        text: Any text.

    Returns:
        The maximum number of '(' open at once.
    """
    depth = deepest = 0
    for character in text:
        if character == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif character == ")" and depth:
            depth -= 1
    return deepest

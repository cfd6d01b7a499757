"""Finds the predicted query in a model response and checks the response format.

The expected format (``EXPECTED_FORMAT``): the response holds exactly one fenced
Markdown code block, tagged ``sql``, and that block holds exactly one SQL query::

    Some reasoning, in any words.
    ```sql
    SELECT name FROM singer ORDER BY age
    ```

Prose before and after the block is allowed. A fence is a line that starts
with three or more backticks (leading spaces allowed); the block closes at the
next line made of backticks only. Everything else (no block, two blocks, an
untagged or differently tagged block, an empty block, several statements, a
statement that is not a query such as ``DROP TABLE`` or ``WITH x AS (...) DELETE``,
a block sqlglot cannot tokenize or parse) fails the format check. So do responses
and blocks over the size caps of `limits` (64 KiB), text with lone surrogates and
SQL nested deeper than `limits.MAX_PAREN_DEPTH`: none of them reaches a parser.
"""

from __future__ import annotations

from dataclasses import dataclass

from reward_fns.text_to_sql.limits import MAX_RESPONSE_BYTES, response_problem, sql_problem
from reward_fns.text_to_sql.sql_analysis import (
    SqlTokenizeError,
    is_query_statement,
    shape_of_statement,
    split_statements,
)

EXPECTED_FORMAT = (
    "Exactly one fenced Markdown code block tagged sql (```sql ... ```) holding exactly one SQL query "
    "(a single SELECT, WITH ... SELECT, compound SELECT or VALUES statement); prose outside the block is "
    f"allowed; at most {MAX_RESPONSE_BYTES // 1024} KiB in all."
)

_FENCE_MARKER = "```"
_EXPECTED_LANGUAGE = "sql"


@dataclass(frozen=True)
class FencedBlock:
    """One fenced code block of a response.

    Attributes:
        language: The first word of the opening fence's info string, lower-cased ("" if none).
        content: The text between the fences.
    """

    language: str
    content: str


@dataclass(frozen=True)
class ExtractedQuery:
    """The outcome of the format check.

    Attributes:
        sql: The one query to execute, or None when the format check failed.
        problem: Why the format check failed, or None when it passed.
        tables: Lower-cased names of the tables the query reads (None when the check failed).
    """

    sql: str | None
    problem: str | None
    tables: frozenset[str] | None = None

    @property
    def format_ok(self) -> bool:
        """True when the response has the expected format."""
        return self.problem is None


class UnclosedFenceError(ValueError):
    """Raised when a response opens a code fence that it never closes."""


def find_fenced_blocks(response: str) -> list[FencedBlock]:
    """Lists the fenced code blocks of a Markdown response, in order.

    Args:
        response: The model's response text.

    Returns:
        The blocks, each with its language tag and content.

    Raises:
        UnclosedFenceError: If the last fence opened is never closed.
    """
    blocks: list[FencedBlock] = []
    open_language: str | None = None
    content_lines: list[str] = []
    for line in response.splitlines():
        stripped = line.strip()
        if open_language is None:
            if stripped.startswith(_FENCE_MARKER):
                info_words = stripped.lstrip("`").split()
                open_language = info_words[0].lower() if info_words else ""
                content_lines = []
        elif stripped.startswith(_FENCE_MARKER) and not stripped.strip("`"):
            blocks.append(FencedBlock(language=open_language, content="\n".join(content_lines)))
            open_language = None
        else:
            content_lines.append(line)
    if open_language is not None:
        raise UnclosedFenceError("a ``` code fence is opened but never closed")
    return blocks


def _single_query_in(block_content: str) -> ExtractedQuery:
    """Checks that a code block holds exactly one query and cuts it out.

    Args:
        block_content: The text inside the ```sql block.

    Returns:
        The query text (without surrounding comments or semicolons), or the problem found.
    """
    if not block_content.strip():
        return ExtractedQuery(sql=None, problem="the ```sql block is empty")
    refusal = sql_problem(block_content)
    if refusal is not None:
        return ExtractedQuery(sql=None, problem=refusal)
    try:
        statements = split_statements(block_content)
    except SqlTokenizeError as error:
        return ExtractedQuery(sql=None, problem=f"sqlglot cannot tokenize the ```sql block: {error}")
    if not statements:
        return ExtractedQuery(sql=None, problem="the ```sql block holds no SQL statement (only comments or ';')")
    if len(statements) > 1:
        return ExtractedQuery(
            sql=None, problem=f"the ```sql block holds {len(statements)} SQL statements; expected exactly one query"
        )
    statement = statements[0]
    if not is_query_statement(statement):
        return ExtractedQuery(
            sql=None, problem=f"the statement starts with {statement[0].text.upper()!r}; expected a SELECT query"
        )
    shape = shape_of_statement(statement, block_content)
    if shape.problem is not None:
        return ExtractedQuery(sql=None, problem=shape.problem)
    query_text = block_content[statement[0].start : statement[-1].end + 1]
    return ExtractedQuery(sql=query_text, problem=None, tables=shape.tables)


def extract_query(response: str) -> ExtractedQuery:
    """Checks a response against ``EXPECTED_FORMAT`` and returns its query.

    Args:
        response: The model's response text.

    Returns:
        The query to execute when the format is right, otherwise the reason it is not.
    """
    refusal = response_problem(response)
    if refusal is not None:
        return ExtractedQuery(sql=None, problem=refusal)
    try:
        blocks = find_fenced_blocks(response)
    except UnclosedFenceError as error:
        return ExtractedQuery(sql=None, problem=str(error))
    if not blocks:
        return ExtractedQuery(sql=None, problem="no ```sql fenced code block found")
    if len(blocks) > 1:
        return ExtractedQuery(sql=None, problem=f"found {len(blocks)} fenced code blocks; expected exactly one")
    language = blocks[0].language
    if language != _EXPECTED_LANGUAGE:
        tag = f"tagged {language!r}" if language else "untagged"
        return ExtractedQuery(sql=None, problem=f"the code block is {tag}; expected a block tagged 'sql'")
    return _single_query_in(blocks[0].content)

"""The response format check of the text-to-SQL verifier (`reward_fns.text_to_sql.parse`)."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reward_fns.text_to_sql import BUNDLED_DB_ROOT, compute_score
from reward_fns.text_to_sql.limits import MAX_PAREN_DEPTH, paren_depth, response_problem, sql_problem
from reward_fns.text_to_sql.parse import extract_query, find_fenced_blocks

# Bounds on wall or CPU time: run alone, after the two-worker part of `make test` (Makefile).
pytestmark = pytest.mark.serial

SINGER_COUNT_GROUND_TRUTH = {"sql": "SELECT count(*) FROM singer", "db_id": "concert_singer"}


def fenced(sql: str, language: str = "sql") -> str:
    """Wraps SQL in a fenced code block."""
    return f"```{language}\n{sql}\n```"


@pytest.mark.parametrize(
    ("response", "expected_sql"),
    [
        pytest.param(fenced("SELECT count(*) FROM singer"), "SELECT count(*) FROM singer", id="bare-fence"),
        pytest.param(
            "Let me count the singers.\n" + fenced("SELECT count(*) FROM singer") + "\nThat is the answer.",
            "SELECT count(*) FROM singer",
            id="prose-around",
        ),
        pytest.param(fenced("SELECT count(*) FROM singer;"), "SELECT count(*) FROM singer", id="trailing-semicolon"),
        pytest.param(
            fenced("-- count them\nSELECT count(*) FROM singer; -- done"),
            "SELECT count(*) FROM singer",
            id="comments-outside-the-statement",
        ),
        pytest.param(fenced("SELECT count(*) FROM singer", "SQL"), "SELECT count(*) FROM singer", id="upper-case-tag"),
        pytest.param(
            "  ```sql\n  SELECT name\n  FROM singer\n  ```", "SELECT name\n  FROM singer", id="indented-fence"
        ),
        pytest.param(
            fenced("SELECT name FROM singer WHERE name = 'a;b'"),
            "SELECT name FROM singer WHERE name = 'a;b'",
            id="semicolon-inside-a-string",
        ),
        pytest.param(
            fenced("WITH old AS (SELECT * FROM singer WHERE age > 40) SELECT name FROM old"),
            "WITH old AS (SELECT * FROM singer WHERE age > 40) SELECT name FROM old",
            id="with-query",
        ),
        pytest.param(
            fenced("SELECT name FROM singer UNION SELECT name FROM concert ORDER BY name"),
            "SELECT name FROM singer UNION SELECT name FROM concert ORDER BY name",
            id="union",
        ),
        pytest.param(
            fenced("WITH a AS (SELECT name FROM singer) SELECT name FROM a EXCEPT SELECT 'x'"),
            "WITH a AS (SELECT name FROM singer) SELECT name FROM a EXCEPT SELECT 'x'",
            id="with-compound-select",
        ),
        pytest.param(fenced("VALUES (1), (2)"), "VALUES (1), (2)", id="values"),
        pytest.param(
            fenced("SELECT " + "(" * 32 + "1" + ")" * 32), "SELECT " + "(" * 32 + "1" + ")" * 32, id="32-levels-deep"
        ),
    ],
)
def test_well_formed_responses_pass_and_yield_the_query(response: str, expected_sql: str) -> None:
    extracted = extract_query(response)
    assert extracted.format_ok, extracted.problem
    assert extracted.sql == expected_sql


@pytest.mark.parametrize(
    ("response", "problem_fragment"),
    [
        pytest.param("SELECT count(*) FROM singer", "no ```sql fenced code block", id="no-fence"),
        pytest.param("The answer is `SELECT count(*) FROM singer`.", "no ```sql fenced code block", id="inline-code"),
        pytest.param(
            fenced("SELECT count(*) FROM singer") + "\nor\n" + fenced("SELECT count(singer_id) FROM singer"),
            "found 2 fenced code blocks",
            id="two-fences",
        ),
        pytest.param(
            "Draft:\n" + fenced("SELECT 1", "") + "\nFinal:\n" + fenced("SELECT count(*) FROM singer"),
            "found 2 fenced code blocks",
            id="draft-block-and-final-block",
        ),
        pytest.param("```sql\n```", "empty", id="empty-fence"),
        pytest.param(fenced("   \n  "), "empty", id="blank-fence"),
        pytest.param(fenced("-- nothing here\n;"), "no SQL statement", id="only-comment-and-semicolon"),
        pytest.param(fenced("SELECT count(*) FROM singer", ""), "untagged", id="untagged-fence"),
        pytest.param(fenced("SELECT count(*) FROM singer", "python"), "tagged 'python'", id="wrong-tag"),
        pytest.param("```sql\nSELECT count(*) FROM singer\n", "never closed", id="unclosed-fence"),
        pytest.param(fenced("SELECT count(*) FROM singer; SELECT 1"), "2 SQL statements", id="two-statements-one-line"),
        pytest.param(
            fenced("SELECT count(*) FROM singer;\nDROP TABLE singer;"), "2 SQL statements", id="query-then-drop"
        ),
        pytest.param(fenced("DROP TABLE singer"), "'DROP'", id="not-a-query"),
        pytest.param(fenced("PRAGMA user_version = 5"), "'PRAGMA'", id="pragma-is-not-a-query"),
        pytest.param(fenced("EXPLAIN SELECT 1"), "'EXPLAIN'", id="explain"),
        pytest.param(fenced("(SELECT count(*) FROM singer)"), "starts with '('", id="parenthesised-sqlite-refuses-it"),
        pytest.param(
            fenced("WITH x AS (SELECT 1) DELETE FROM singer"), "the statement is a DELETE", id="delete-behind-a-cte"
        ),
        pytest.param(
            fenced("WITH x AS (SELECT 1) INSERT INTO singer (Name) SELECT 'a' FROM x"),
            "the statement is a INSERT",
            id="insert-behind-a-cte",
        ),
        pytest.param(
            fenced("WITH x AS (SELECT 1) UPDATE singer SET Age = 0"),
            "the statement is a UPDATE",
            id="update-behind-a-cte",
        ),
        pytest.param(fenced("SELECT 'unterminated"), "sqlglot cannot tokenize", id="untokenizable"),
        pytest.param(
            fenced("SELECT name FROM"), "sqlglot cannot parse the query: Expected table name", id="unparseable"
        ),
        pytest.param(
            fenced("SELECT " + "(" * 33 + "1" + ")" * 33), "nests parentheses 33 levels deep", id="33-levels-deep"
        ),
        pytest.param(fenced("SELECT " + "NOT " * 2000 + "1"), "nested too deeply for the SQL parser", id="deep-not"),
        pytest.param(fenced("SELECT 1 -- " + "x" * 70_000), "over 65536 bytes are refused", id="response-over-64-kib"),
        pytest.param(fenced("SELECT '\ud800'"), "lone surrogate", id="lone-surrogate"),
    ],
)
def test_malformed_responses_fail_with_a_reason(response: str, problem_fragment: str) -> None:
    extracted = extract_query(response)
    assert not extracted.format_ok
    assert extracted.sql is None
    assert problem_fragment in (extracted.problem or "")


def test_a_fence_line_with_an_info_string_does_not_close_a_block() -> None:
    # Like CommonMark: only a line of backticks closes a block.
    blocks = find_fenced_blocks("```sql\nSELECT 1\n```sql\nSELECT 2\n```")
    assert len(blocks) == 1
    assert blocks[0].content == "SELECT 1\n```sql\nSELECT 2"


def test_format_failure_skips_execution_and_says_so() -> None:
    result = compute_score("spider", "SELECT count(*) FROM singer", SINGER_COUNT_GROUND_TRUTH)
    assert (result["sql_format"], result["sql_executability"], result["sql_execution"]) == (0.0, 0.0, 0.0)
    assert result["score"] == 0.0
    assert "no ```sql fenced code block" in str(result["sql_format_info"])
    assert "Not executed" in str(result["sql_executability_info"])
    # The gold side is still reported, whatever the response.
    assert "Gold SQL: SELECT count(*) FROM singer" in str(result["sql_execution_info"])


def test_format_info_states_the_expected_format() -> None:
    result = compute_score("spider", fenced("SELECT count(*) FROM singer"), SINGER_COUNT_GROUND_TRUTH)
    info = str(result["sql_format_info"])
    assert info.startswith("Expected format: Exactly one fenced Markdown code block tagged sql")
    assert info.endswith("Check: passed")


prose_without_backticks = st.text(
    alphabet=st.characters(exclude_characters="`", exclude_categories=["Cs"]), max_size=200
)


@given(before=prose_without_backticks, after=prose_without_backticks)
def test_any_prose_around_the_single_block_is_accepted(before: str, after: str) -> None:
    response = before + "\n" + fenced("SELECT name FROM singer ORDER BY age") + "\n" + after
    extracted = extract_query(response)
    assert extracted.format_ok, extracted.problem
    assert extracted.sql == "SELECT name FROM singer ORDER BY age"


def test_dml_behind_a_cte_is_neither_well_formed_nor_executed() -> None:
    result = compute_score("spider", fenced("WITH x AS (SELECT 1) DELETE FROM singer"), SINGER_COUNT_GROUND_TRUTH)
    assert (result["sql_format"], result["sql_executability"], result["sql_execution"]) == (0.0, 0.0, 0.0)
    assert "the statement is a DELETE; expected a SELECT query" in str(result["sql_format_info"])
    assert "Not executed" in str(result["sql_executability_info"])


def test_the_size_and_depth_caps_are_checked_before_any_parser() -> None:
    # A megabyte of `1 + 1 + ...` would keep sqlglot busy for about 10 s.
    started = time.monotonic()
    assert response_problem("x" * 10_000_000) is not None
    assert sql_problem("SELECT " + " + ".join(["1"] * 300_000)) is not None
    assert time.monotonic() - started < 0.5
    assert paren_depth("f(a, (b)) + ((c)") == 2
    assert paren_depth(")))(") == 1
    assert sql_problem("SELECT " + "(" * MAX_PAREN_DEPTH + "1" + ")" * MAX_PAREN_DEPTH) is None


def test_every_bundled_gold_query_is_within_the_caps() -> None:
    lines = (BUNDLED_DB_ROOT / "dev_subset.jsonl").read_text(encoding="utf-8").splitlines()
    depths = [paren_depth(json.loads(line)["query"]) for line in lines]
    assert max(depths) <= 4
    assert all(sql_problem(json.loads(line)["query"]) is None for line in lines)

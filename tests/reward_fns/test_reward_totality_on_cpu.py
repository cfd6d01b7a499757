"""Every family's compute_score is total over responses; an unreadable ground truth is a named error.

The fuzz goes through ``reward_fns.dispatch.compute_score`` on real ground truths from the shipped
data (the bundled Spider subset, BFCL v4 from the ``bfcl-eval`` wheel, IFEval), with responses
built to hurt parsers: nested SQL and JSON, Python call lists, huge literals, lone surrogates and
other odd code points. It asserts the fixed key set, finite scores in [0, 1] and *no* internal
error (``reward/<family>/internal_errors`` stays 0): the families themselves must be total; the
wrapper is the last line, tested separately below with a scorer that fails on purpose.
"""

from __future__ import annotations

import json
import logging
import math
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reward_fns import dispatch, total
from reward_fns.instruction_following import UnsupportedConstraintError
from reward_fns.instruction_following.data import load_benchmark
from reward_fns.text_to_sql import BUNDLED_DB_ROOT
from reward_fns.tool_calling import verifier as tool_calling_verifier
from reward_fns.tool_calling.bfcl_data import load_bfcl_category
from reward_fns.total import MAX_RESPONSE_CHARS, GroundTruthError, internal_errors_key, total_over_responses

FUZZ = settings(
    max_examples=60,  # per test; the tool-calling and instruction-following ones run more (cheap)
    deadline=None,
    derandomize=True,  # the same examples on every CI run: a failure reproduces
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


@cache
def sql_rows() -> list[dict[str, Any]]:
    lines = (BUNDLED_DB_ROOT / "dev_subset.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines[:40:8]]
    return [{"sql": record["query"], "db_id": record["db_id"]} for record in records]


@cache
def tool_rows() -> list[dict[str, Any]]:
    items = [load_bfcl_category("simple_python")[0], load_bfcl_category("parallel_multiple")[21]]
    live = {item.id: item for item in load_bfcl_category("live_multiple")}
    items.append(live["live_multiple_121-46-0"])  # a nested dict literal among the acceptable values
    return [item.ground_truth() for item in items]


@cache
def if_rows() -> list[dict[str, Any]]:
    records = [r for r in load_benchmark("ifeval") if len(r["instruction_id_list"]) <= 3]
    return [records[i] for i in (0, 7, 21)]


def deep(open_: str, close: str, depth: int, core: str = "1") -> str:
    return open_ * depth + core + close * depth


odd_text = st.text(
    st.one_of(
        st.characters(),  # any code point but surrogates
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates
        st.sampled_from(["\x00", "\u202e", "\ufeff", "\u0301", "💥", "\r", "`", "<", ">", "'", '"', "\\"]),
    ),
    max_size=200,
)
json_data = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | odd_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(odd_text, children, max_size=4),
    max_leaves=20,
)
depth = st.integers(min_value=0, max_value=3_000)
huge = st.integers(min_value=1_000, max_value=MAX_RESPONSE_CHARS + 10)

sql_block = st.one_of(
    odd_text,
    depth.map(lambda d: f"SELECT {deep('(', ')', d)}"),
    depth.map(lambda d: f"SELECT {deep('coalesce(', ', 1)', d)}"),
    depth.map(lambda d: "SELECT 1" + " + 1" * d),
    depth.map(lambda d: f"WITH x AS (SELECT 1) DELETE FROM singer {'-' * d}"),
    huge.map(lambda n: f"SELECT '{'x' * n}'"),
    huge.map(lambda n: "SELECT " + "9" * n),
    st.just("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r WHERE i<64) SELECT zeroblob(9999) FROM r"),
    st.just("SELECT printf('%.*c', 2147483647, 'x') IS NULL"),
)
sql_response = st.one_of(
    sql_block.map(lambda sql: f"```sql\n{sql}\n```"),
    st.tuples(odd_text, sql_block, odd_text).map(lambda p: f"{p[0]}```sql\n{p[1]}\n```{p[2]}"),
    odd_text,
)
tool_call = st.fixed_dictionaries({"name": odd_text | st.sampled_from(["calculate_triangle_area", "f"])}).flatmap(
    lambda call: st.dictionaries(odd_text, json_data, max_size=4).map(lambda args: {**call, "arguments": args})
)
tool_response = st.one_of(
    st.lists(tool_call, min_size=1, max_size=3).map(
        lambda calls: "\n".join(f"<tool_call>{json.dumps(c, ensure_ascii=False)}</tool_call>" for c in calls)
    ),
    depth.map(lambda d: f"<tool_call>{deep('[', ']', d)}</tool_call>"),
    depth.map(lambda d: f'<tool_call>{{"name": "f", "arguments": {{"a": {deep("[", "]", d)}}}}}</tool_call>'),
    depth.map(lambda d: f"[f(a={deep('[', ']', d)})]"),
    depth.map(lambda d: f"[f(a={deep('(', ')', d)})]"),
    depth.map(lambda d: f"[{deep('f(a=', ')', d)}]"),
    huge.map(lambda n: f'<tool_call>{{"name": "f", "arguments": {{"a": {"9" * n}}}}}</tool_call>'),
    huge.map(lambda n: f"[f(a={'9' * n})]"),
    huge.map(lambda n: f"[f(a='{'x' * n}')]"),
    st.tuples(odd_text, odd_text).map(lambda p: f"<think>{p[0]}</think><tool_call>{p[1]}</tool_call>"),
    odd_text,
)
if_response = st.one_of(
    odd_text,
    huge.map(lambda n: "word " * (n // 5)),
    huge.map(lambda n: "\U0001f4a5" * n),
    st.tuples(odd_text, depth).map(lambda p: p[0] * (p[1] // max(len(p[0]), 1) + 1)),
    depth.map(lambda d: deep("{", "}", d, '"a": 1')),
)


def check_total(data_source: str, response: str, ground_truth: Any, family: str) -> None:
    result = dispatch.compute_score(data_source, response, ground_truth, {"index": 0})
    keys = dispatch.reward_keys()
    assert set(result) == {"score", *keys, *map(dispatch.info_key, keys), *dispatch.counter_keys()}
    for key in ("score", *keys, *dispatch.counter_keys()):
        assert isinstance(result[key], float) and math.isfinite(result[key]) and 0.0 <= result[key] <= 1.0, key
    assert all(isinstance(result[dispatch.info_key(key)], str) for key in keys)
    assert result[internal_errors_key(family)] == 0.0, result[f"{dispatch.reward_keys(family)[0]}_info"]


# The largest hostile answers under the cap, always run (hypothesis favours small sizes).
NEAR_CAP = MAX_RESPONSE_CHARS - 100


@FUZZ
@example(response=f"```sql\nSELECT {deep('(', ')', NEAR_CAP // 2)}\n```", row=0)
@example(response=f"```sql\nSELECT {'1 + ' * (NEAR_CAP // 4)}1\n```", row=1)
@example(response=f"```sql\nSELECT '{chr(0xD800) * NEAR_CAP}'\n```", row=2)
@given(response=sql_response, row=st.integers(min_value=0, max_value=4))
def test_text_to_sql_is_total(response: str, row: int) -> None:
    check_total("spider", response, sql_rows()[row], "text_to_sql")


@settings(FUZZ, max_examples=200)
@example(response=f"<tool_call>{deep('[', ']', NEAR_CAP // 2)}</tool_call>", row=0)
@example(
    response="<tool_call>" + deep('{"name": "f", "arguments": {"a": ', "}}", NEAR_CAP // 40) + "</tool_call>", row=1
)
@example(response=f"[f(a={deep('(', ')', NEAR_CAP // 2)})]", row=2)
@example(response=f"[f(a={deep('[', ']', NEAR_CAP // 2)})]", row=0)
@example(response=f"[{deep('f(a=', ')', NEAR_CAP // 5)}]", row=1)
@example(response="<tool_call>" * (NEAR_CAP // 11), row=2)
@given(response=tool_response, row=st.integers(min_value=0, max_value=2))
def test_tool_calling_is_total(response: str, row: int) -> None:
    check_total("bfcl/live_multiple", response, tool_rows()[row], "tool_calling")


@settings(FUZZ, max_examples=100)
@example(response="\U0001f4a5" * NEAR_CAP, row=0)
@example(response=chr(0xDFFF) * NEAR_CAP, row=1)
@example(response="word, " * (NEAR_CAP // 6), row=2)
@given(response=if_response, row=st.integers(min_value=0, max_value=2))
def test_instruction_following_is_total(response: str, row: int) -> None:
    check_total("ifeval", response, if_rows()[row], "instruction_following")


# --- the wrapper itself, with scorers that fail on purpose -------------------------------------


@total_over_responses(
    "tool_calling",
    read_ground_truth=tool_calling_verifier.read_ground_truth,
    reward_keys=lambda arguments: tool_calling_verifier.REWARD_KEYS,
    ground_truth_errors=(UnsupportedConstraintError,),
)
def failing_scorer(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any):
    if solution_str == "nan":
        infos = {"tool_format_info": "", "tool_correctness_info": ""}
        return {"score": math.nan, "tool_format": 0.0, "tool_correctness": 0.0, **infos}
    if solution_str == "unsupported":
        raise UnsupportedConstraintError("no checker for this")
    return [[[solution_str]]][0][1]  # IndexError: a verifier bug that this response triggers


def test_an_internal_error_scores_zero_is_counted_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    total.reset_internal_errors()
    truth = tool_rows()[0]
    with caplog.at_level(logging.ERROR, logger="reward_fns.total"):
        results = [failing_scorer("bfcl", response, truth, {"index": 5}) for response in ("a", "b", "c")]
    for result in results:
        assert result["score"] == result["tool_format"] == result["tool_correctness"] == 0.0
        assert result["reward/tool_calling/internal_errors"] == 1.0
        assert "Verifier internal error (IndexError: list index out of range)" in result["tool_correctness_info"]
    assert total.internal_error_counts() == {"tool_calling": 3}
    logged = [record for record in caplog.records if "internal error scored as 0" in record.getMessage()]
    assert len(logged) == 1  # one site, three calls
    assert "Traceback" in logged[0].getMessage() and "failing_scorer" in logged[0].getMessage()


def test_a_non_finite_score_is_an_internal_error() -> None:
    result = failing_scorer("bfcl", "nan", tool_rows()[0])
    assert result["score"] == 0.0 and result["reward/tool_calling/internal_errors"] == 1.0
    assert "non-finite score" in result["tool_format_info"]


def test_an_error_that_means_bad_ground_truth_is_raised_naming_the_row() -> None:
    with pytest.raises(UnsupportedConstraintError, match=r"data_source='bfcl', row index=9 \(split 'train'\)"):
        failing_scorer("bfcl", "unsupported", tool_rows()[0], {"index": 9, "split": "train"})


def test_a_response_over_the_cap_is_refused_unread_not_an_internal_error() -> None:
    result = dispatch.compute_score("bfcl/simple", "x" * (MAX_RESPONSE_CHARS + 1), tool_rows()[0], {})
    assert result["score"] == 0.0 and result["reward/tool_calling/internal_errors"] == 0.0
    assert "refused unread" in result["tool_format_info"]


@pytest.mark.parametrize(
    ("data_source", "ground_truth", "error_type", "message"),
    [
        ("spider", {"sql": "SELECT 1", "db_id": "no_such_db"}, FileNotFoundError, "database file not found"),
        ("spider", "SELECT 1", ValueError, "not JSON"),
        ("bfcl/simple", {"answers": [{"f": {"a": 1}}]}, ValueError, "acceptable values must be a non-empty list"),
        ("bfcl/simple", "[]", ValueError, "at least one expected call"),
        ("ifeval", {"kwargs": []}, ValueError, "instruction_id_list"),
        ("ifeval", {"instruction_id_list": ["no:such_id"], "kwargs": [{}]}, UnsupportedConstraintError, "no:such_id"),
    ],
)
def test_unreadable_ground_truth_raises_naming_data_source_and_index(
    data_source: str, ground_truth: Any, error_type: type[Exception], message: str
) -> None:
    with pytest.raises(GroundTruthError, match=rf"data_source='{data_source}', row index=41 .*{message}") as caught:
        dispatch.compute_score(data_source, "any response", ground_truth, {"index": 41, "split": "test"})
    assert isinstance(caught.value, error_type)  # the reader's own type is kept


def test_a_row_without_index_says_so() -> None:
    with pytest.raises(GroundTruthError, match="row index=unknown"):
        dispatch.compute_score("spider", "x", {"sql": "SELECT 1", "db_id": "no_such_db"}, None)

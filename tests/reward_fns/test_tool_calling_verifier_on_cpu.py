"""The reward-function contract: keys, score, verifier information and ground-truth forms."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from reward_fns import tool_calling
from reward_fns.tool_calling import DATA_SOURCES, REWARD_KEYS, compute_score
from reward_fns.tool_calling.reference import parse_ground_truth

FUNCTIONS = [
    {
        "name": "flights.search",
        "description": "Search flights.",
        "parameters": {
            "type": "dict",
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "passengers": {"type": "integer"},
                "budget": {"type": "dict", "properties": {"max": {"type": "float"}}},
            },
            "required": ["origin", "destination"],
        },
    },
    {"name": "hotels.search", "parameters": {"type": "dict", "properties": {"city": {"type": "string"}}}},
]
BFCL_GROUND_TRUTH = {
    "functions": FUNCTIONS,
    "answers": [
        {
            "flights.search": {
                "origin": ["SFO", "San Francisco"],
                "destination": ["JFK"],
                "passengers": [2, ""],
                "budget": [{"max": [500, 500.0]}, ""],
            }
        }
    ],
}
GOLD_RESPONSE = (
    '<tool_call>\n{"name": "flights.search", "arguments": {"origin": "SFO", "destination": "JFK"}}\n</tool_call>'
)
COUNTER_KEYS = {"reward/tool_calling/internal_errors", "reward/tool_calling/timeouts"}
EXPECTED_KEYS = {"score", *COUNTER_KEYS, *REWARD_KEYS, *(f"{key}_info" for key in REWARD_KEYS)}


def test_contract_constants() -> None:
    assert DATA_SOURCES == ("bfcl", "toolrl", "tool_calling")
    assert REWARD_KEYS == ("tool_format", "tool_correctness")
    assert tool_calling.compute_score is compute_score


@pytest.mark.parametrize(
    "response",
    [
        GOLD_RESPONSE,
        "no call at all",
        '<tool_call>{"name": "hotels.search", "arguments": {"city": "Rome"}}</tool_call>',
    ],
)
def test_always_the_same_keys_and_score_is_the_mean(response: str) -> None:
    result = compute_score("bfcl/simple", response, BFCL_GROUND_TRUTH, extra_info={"index": 3}, unused_kwarg=True)
    assert set(result) == EXPECTED_KEYS
    assert result["tool_format"] in (0.0, 1.0)
    assert 0.0 <= result["tool_correctness"] <= 1.0
    assert result["score"] == pytest.approx((result["tool_format"] + result["tool_correctness"]) / 2)
    assert all(isinstance(result[f"{key}_info"], str) for key in REWARD_KEYS)


def test_gold_scores_one_and_optional_arguments_may_be_given() -> None:
    assert compute_score("bfcl", GOLD_RESPONSE, BFCL_GROUND_TRUTH)["score"] == 1.0
    with_optionals = (
        '<tool_call>{"name": "flights.search", "arguments": {"origin": "san francisco", "destination": "JFK", '
        '"passengers": 2, "budget": {"max": 500}}}</tool_call>'
    )
    assert compute_score("bfcl", with_optionals, BFCL_GROUND_TRUTH)["score"] == 1.0


def test_verifier_information_names_reference_functions_and_problems() -> None:
    wrong = '<tool_call>{"name": "flights.search", "arguments": {"origin": "LAX", "destination": "JFK"}}</tool_call>'
    result = compute_score("bfcl", wrong, BFCL_GROUND_TRUTH)
    assert result["tool_correctness"] == pytest.approx((1 + 1 + 1 / 2) / 3)
    info = result["tool_correctness_info"]
    assert info.startswith("Functions: flights.search, hotels.search\nReference call(s): flights.search(")
    assert 'origin="SFO" | "San Francisco"' in info
    assert 'budget={"max": 500 | 500.0} (optional)' in info
    assert "flights.search.origin: wrong value 'LAX'" in info
    assert "Problems" not in compute_score("bfcl", GOLD_RESPONSE, BFCL_GROUND_TRUTH)["tool_correctness_info"]
    assert result["tool_format_info"].startswith("Expected format: one or more <tool_call>")


TOOLRL_CALLS = [
    {"name": "hotels.search", "arguments": {"city": "Rome"}},
    {"name": "flights.search", "parameters": {"origin": "SFO", "destination": "FCO", "budget": {"max": 800}}},
]
TOOLRL_RESPONSE = (
    '<tool_call>[{"name": "flights.search", "arguments": '
    '{"origin": "SFO", "destination": "FCO", "budget": {"max": 800}}}, '
    '{"name": "hotels.search", "arguments": {"city": "rome"}}]</tool_call>'
)


@pytest.mark.parametrize(
    "ground_truth",
    [
        TOOLRL_CALLS,
        json.dumps(TOOLRL_CALLS),
        {"functions": FUNCTIONS, "calls": TOOLRL_CALLS},
        {"functions": [{"type": "function", "function": function} for function in FUNCTIONS], "calls": TOOLRL_CALLS},
        "<tool_call>\n" + "\n".join(json.dumps(call) for call in TOOLRL_CALLS) + "\n</tool_call>",
    ],
)
def test_exact_reference_calls_in_every_accepted_form(ground_truth: Any) -> None:
    assert compute_score("toolrl", TOOLRL_RESPONSE, ground_truth)["score"] == 1.0
    wrong_budget = TOOLRL_RESPONSE.replace("800", "900")
    assert compute_score("toolrl", wrong_budget, ground_truth)["tool_correctness"] < 1.0


def test_ground_truth_after_a_parquet_round_trip() -> None:
    # pandas/pyarrow hand nested lists back as numpy arrays.
    answers = [{"flights.search": {"origin": np.array(["SFO"]), "destination": np.array(["JFK"])}}]
    ground_truth = {"functions": np.array(FUNCTIONS, dtype=object), "answers": np.array(answers, dtype=object)}
    assert compute_score("bfcl", GOLD_RESPONSE, ground_truth)["score"] == 1.0
    assert compute_score("bfcl", GOLD_RESPONSE, json.dumps(BFCL_GROUND_TRUTH))["score"] == 1.0


def _answer(arguments: Any) -> dict[str, Any]:
    return {"functions": FUNCTIONS, "answers": [{"flights.search": arguments}]}


@pytest.mark.parametrize(
    ("ground_truth", "message"),
    [
        ("not json", "neither JSON nor tool calls"),
        (42, "must be an object or a list of calls"),
        ({"functions": FUNCTIONS}, "exactly one of 'answers'"),
        ({"answers": [], "calls": []}, "exactly one of 'answers'"),
        ({"answers": [{"f": {}}], "solution": 1}, "exactly one of 'answers'"),
        ({"answers": []}, "at least one expected call"),
        ({"answers": [{"f": {}, "g": {}}]}, "exactly one function name"),
        ({"answers": [{"f": {"a": 1}}]}, "non-empty list"),
        ({"answers": [{"f": {"a": []}}]}, "non-empty list"),
        (
            _answer({"origin": ["SFO"], "destination": ["JFK"], "budget": [{"max": 500}]}),
            "flights.search.budget: dict pattern keys ['max'] must map to lists",
        ),
        ({"functions": "f", "answers": [{"f": {}}]}, "'functions' must be a list"),
        ({"functions": [{"parameters": {}}], "answers": [{"f": {}}]}, "string 'name'"),
        (_answer({"origin": ["SFO"]}), "lacks required argument(s) ['destination']"),
        ({"functions": FUNCTIONS, "answers": [{"cars.rent": {}}]}, "not among the functions"),
        (
            {
                "functions": [{"name": "f", "parameters": {"properties": {"a": {"type": "quaternion"}}}}],
                "answers": [{"f": {"a": [1]}}],
            },
            "f.a: unknown JSON-schema type 'quaternion'",
        ),
        ([{"arguments": {}}], "string 'name'"),
        ([{"name": "f", "arguments": [1]}], "arguments must be an object"),
    ],
)
def test_malformed_ground_truth_raises_a_clear_error(ground_truth: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        compute_score("bfcl", GOLD_RESPONSE, ground_truth)


def test_reference_marks_optional_and_schema_required_arguments_mandatory() -> None:
    (call,) = parse_ground_truth(BFCL_GROUND_TRUTH).calls
    assert call.mandatory == {"origin", "destination"}
    # An exact ToolRL value "" would read as BFCL's optional marker; that is the documented meaning.
    (exact,) = parse_ground_truth([{"name": "f", "arguments": {"a": 1, "b": ""}}]).calls
    assert exact.mandatory == {"a"}

"""BFCL value rules and the continuous correctness score, on hand-built references."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_fns.tool_calling.match import normalize_string, score_call, score_calls
from reward_fns.tool_calling.parse import ToolCall
from reward_fns.tool_calling.reference import parse_ground_truth
from reward_fns.tool_calling.values import value_problem

AREA_REFERENCE = parse_ground_truth(
    {
        "functions": [
            {
                "name": "geometry.area",
                "parameters": {
                    "type": "dict",
                    "properties": {
                        "base": {"type": "integer"},
                        "height": {"type": "float"},
                        "shape": {"type": "string"},
                        "unit": {"type": "string"},
                    },
                    "required": ["base", "height", "shape"],
                },
            }
        ],
        "answers": [{"geometry.area": {"base": [10], "height": [5.0], "shape": ["triangle"], "unit": ["cm", ""]}}],
    }
)
AREA_SCHEMA = AREA_REFERENCE.functions[0].properties
GOLD_AREA = ToolCall("geometry.area", {"base": 10, "height": 5.0, "shape": "triangle"})


def _area_score(arguments: dict[str, Any], name: str = "geometry.area") -> float:
    return score_call(ToolCall(name, arguments), AREA_REFERENCE.calls[0], AREA_SCHEMA).total


@pytest.mark.parametrize(
    ("arguments", "name", "expected"),
    [
        ({"base": 10, "height": 5.0, "shape": "triangle"}, "geometry.area", 1.0),
        ({"base": 10, "height": 5.0, "shape": "triangle", "unit": "cm"}, "geometry.area", 1.0),
        # The name term alone is lost: (0 + 1 + 1) / 3.
        ({"base": 10, "height": 5.0, "shape": "triangle"}, "geometry.volume", 2 / 3),
        # Missing "shape": s_args = 2/3, s_value = 2/3.
        ({"base": 10, "height": 5.0}, "geometry.area", (1 + 2 / 3 + 2 / 3) / 3),
        # Extra argument: s_args = 3/4, s_value = 1.
        ({"base": 10, "height": 5.0, "shape": "triangle", "color": "red"}, "geometry.area", (1 + 3 / 4 + 1) / 3),
        # Wrong value, wrong type (string for integer), wrong optional value: s_value = 2/3 each.
        ({"base": 11, "height": 5.0, "shape": "triangle"}, "geometry.area", (1 + 1 + 2 / 3) / 3),
        ({"base": "10", "height": 5.0, "shape": "triangle"}, "geometry.area", (1 + 1 + 2 / 3) / 3),
        ({"base": 10, "height": 5.0, "shape": "triangle", "unit": "mm"}, "geometry.area", (1 + 1 + 3 / 4) / 3),
        # Everything wrong but the name: s_args = 0 / (0 + 3 + 1), s_value = 0 / 3.
        ({"colour": "red"}, "geometry.area", 1 / 3),
    ],
)
def test_call_score_matches_hand_computed_values(arguments: dict[str, Any], name: str, expected: float) -> None:
    assert _area_score(arguments, name) == pytest.approx(expected, abs=1e-12)


def test_bfcl_lenient_rules_still_give_full_marks() -> None:
    # Integer for a float, case / spacing / punctuation in strings, dots written as underscores.
    assert _area_score({"base": 10, "height": 5, "shape": " Tri-angle. "}) == 1.0
    assert _area_score({"base": 10, "height": 5.0, "shape": "triangle"}, name="geometry_area") == 1.0


def test_booleans_are_not_numbers() -> None:
    assert _area_score({"base": True, "height": 5.0, "shape": "triangle"}) < 1.0
    assert value_problem(True, [1], {"type": "integer"}) == "wrong type"
    assert value_problem(1, [True], {"type": "boolean"}) == "wrong type"
    assert value_problem(False, [0.0], {"type": "float"}) == "wrong type"


FLOATS = {"type": "array", "items": {"type": "float"}}
DICTS = {"type": "array", "items": {"type": "dict"}}
EGO = {"type": "dict", "properties": {"position": {"type": "dict"}, "orientation": {"type": "float"}}}
EGO_ANSWER = {"position": [{"lateral": 10.5, "longitudinal": 50}], "orientation": [30]}


@pytest.mark.parametrize(
    ("value", "acceptable", "schema", "problem"),
    [
        # Numbers: an int where a float is declared is converted first; never a float for an int.
        (5, [5.0], {"type": "float"}, None),
        (5.5, [5], {"type": "integer"}, "wrong type"),
        (5.0, [5], {"type": "integer"}, "wrong type"),
        # Array items: only one level is checked, exactly (an int item is not a float item).
        ([1.0, 2.5], [[1.0, 2.5]], FLOATS, None),
        ([1, 2.5], [[1.0, 2.5]], FLOATS, "wrong type"),
        ([1, 2.5], [[1, 2.5]], FLOATS, None),  # items of the answer's own item type
        ([1, 2.5], ["", [1.0, 2.5]], FLOATS, None),  # "" first skips the item check; then 1 == 1.0
        # The possible answer's own type is accepted where the schema declares another (a "variable"),
        # and then compared exactly, without string normalisation.
        ("data['sales']", ["data['sales']"], FLOATS, None),
        ("DATA['sales']", ["data['sales']"], FLOATS, "wrong value"),
        (True, [True], {"type": "string"}, None),
        (5, [5], {"type": "any"}, None),
        ([1], ["x"], {"type": "any"}, "wrong type"),
        ("x", ["X"], {"type": "any"}, None),  # any is str, normalised
        # Explicit null: accepted exactly when null is among the acceptable values.
        (None, [None, ""], {"type": "string"}, None),
        (None, ["", None], {"type": "integer"}, None),
        (None, ["", "x"], {"type": "string"}, "wrong type"),
        # Dicts: a pattern of acceptable values per key; nested dicts in it are literals (live_multiple_121-46-0).
        ({"position": {"lateral": 10.5, "longitudinal": 50}, "orientation": 30}, [EGO_ANSWER], EGO, None),
        ({"position": {"lateral": 10.5, "longitudinal": 50.0}, "orientation": 30}, [EGO_ANSWER], EGO, None),
        ({"position": {"lateral": "10.5", "longitudinal": 50}, "orientation": 30}, [EGO_ANSWER], EGO, "wrong value"),
        ({"position": {"lateral": 10.5}, "orientation": 30}, [EGO_ANSWER], EGO, "wrong value"),
        ({"min": 1, "max": 2}, [{"min": [1], "max": [2, 3]}], {"type": "dict"}, None),
        ({"min": 1}, [{"min": [1], "max": [2, ""]}], {"type": "dict"}, None),
        ({"min": 1}, [{"min": [1], "max": [2]}], {"type": "dict"}, "wrong value"),
        ({"min": 1, "extra": 0}, [{"min": [1]}], {"type": "dict"}, "wrong value"),
        # Lists of dicts: one pattern per position.
        ([{"field": "age"}], [[{"field": ["age"], "op": [">", ""]}]], DICTS, None),
        ([{"field": "Age "}], [[{"field": ["age"], "op": [">", ""]}]], DICTS, None),
        ([{"op": ">"}], [[{"field": ["age"], "op": [">", ""]}]], DICTS, "wrong value"),
        # Strings and plain lists: normalised at the top level only.
        ("New York, NY", ["new york ny"], {"type": "string"}, None),
        ("it's", ['it"s'], {"type": "string"}, None),
        ("Paris", ["London"], {"type": "string"}, "wrong value"),
        ("", [""], {"type": "string"}, None),
        (["A b"], [["ab"]], {"type": "array", "items": {"type": "string"}}, None),
        ([2, 1], [[1, 2]], {"type": "array", "items": {"type": "integer"}}, "wrong value"),
        # Without a schema the acceptable value's type is expected.
        ("x", ["X"], None, None),
        (1, ["1"], None, "wrong type"),
        (None, [None], {}, None),
        # A union of types: any member may accept.
        (None, [None], {"type": ["string", "null"]}, None),
        ("x", ["x"], {"type": "String"}, None),
    ],
)
def test_bfcl_value_rules(
    value: Any, acceptable: list[Any], schema: dict[str, Any] | None, problem: str | None
) -> None:
    assert value_problem(value, acceptable, schema) == problem


def test_normalize_string_ignores_what_bfcl_ignores() -> None:
    assert normalize_string("San Francisco, CA.") == normalize_string("san_francisco/ca") == "sanfranciscoca"
    assert normalize_string("a*b^c-d") == "abcd"


PARALLEL_REFERENCE = parse_ground_truth(
    {
        "answers": [
            {"weather": {"city": ["Paris"]}},
            {"weather": {"city": ["Rome"]}},
            {"time": {"zone": ["CET", "Europe/Paris"]}},
        ]
    }
)
PARALLEL_GOLD = [
    ToolCall("weather", {"city": "Paris"}),
    ToolCall("weather", {"city": "Rome"}),
    ToolCall("time", {"zone": "CET"}),
]


def test_parallel_calls_missing_extra_and_duplicated() -> None:
    assert score_calls(PARALLEL_GOLD, PARALLEL_REFERENCE).correctness == 1.0
    assert score_calls(PARALLEL_GOLD[::-1], PARALLEL_REFERENCE).correctness == 1.0
    assert score_calls(PARALLEL_GOLD[:2], PARALLEL_REFERENCE).correctness == pytest.approx(2 / 3)
    assert score_calls([*PARALLEL_GOLD, PARALLEL_GOLD[0]], PARALLEL_REFERENCE).correctness == pytest.approx(3 / 4)
    # Two Paris calls: one matches, the other earns the name and argument-name terms against Rome.
    doubled = [PARALLEL_GOLD[0], PARALLEL_GOLD[0], PARALLEL_GOLD[2]]
    assert score_calls(doubled, PARALLEL_REFERENCE).correctness == pytest.approx((1 + 2 / 3 + 1) / 3)
    assert score_calls([], PARALLEL_REFERENCE).correctness == 0.0


def test_problems_name_what_went_wrong() -> None:
    result = score_calls([ToolCall("weather", {"city": "Berlin"}), ToolCall("date", {})], PARALLEL_REFERENCE)
    text = "; ".join(result.problems)
    assert "weather.city: wrong value 'Berlin'" in text
    assert "missing call" in text


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.sampled_from(["Paris", "Rome", "CET", ""])
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
RANDOM_CALLS = st.lists(
    st.builds(
        ToolCall,
        name=st.sampled_from(["weather", "time", "date", "geometry.area", "geometry_area"]),
        arguments=st.dictionaries(
            st.sampled_from(["city", "zone", "base", "height", "shape", "x"]), JSON_VALUES, max_size=4
        ),
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(RANDOM_CALLS)
def test_correctness_is_within_unit_interval(calls: list[ToolCall]) -> None:
    for reference in (PARALLEL_REFERENCE, AREA_REFERENCE):
        assert 0.0 <= score_calls(calls, reference).correctness <= 1.0


@settings(max_examples=200, deadline=None)
@given(RANDOM_CALLS, st.randoms(use_true_random=False))
def test_permuting_calls_never_changes_the_score(calls: list[ToolCall], random: Any) -> None:
    shuffled = list(calls)
    random.shuffle(shuffled)
    for reference in (PARALLEL_REFERENCE, AREA_REFERENCE):
        assert score_calls(shuffled, reference).correctness == pytest.approx(
            score_calls(calls, reference).correctness, abs=1e-12
        )


@settings(max_examples=200, deadline=None)
@given(RANDOM_CALLS)
def test_surplus_calls_and_replaced_calls_lower_the_score(calls: list[ToolCall]) -> None:
    # Surplus calls cannot beat gold calls at their own references, so each only enlarges the denominator.
    with_surplus = score_calls([*PARALLEL_GOLD, *calls], PARALLEL_REFERENCE).correctness
    assert with_surplus == pytest.approx(3 / (3 + len(calls)), abs=1e-12)
    if calls:
        replaced = score_calls([calls[0], *PARALLEL_GOLD[1:]], PARALLEL_REFERENCE).correctness
        assert (replaced == 1.0) == (calls[0] == PARALLEL_GOLD[0])

"""The verifier on the real BFCL v4 data shipped in the ``bfcl-eval`` wheel.

Files (JSON lines, ``bfcl_eval/data/``): ``BFCL_v4_simple_python.json`` (400),
``BFCL_v4_multiple.json`` (200), ``BFCL_v4_parallel.json`` (200),
``BFCL_v4_parallel_multiple.json`` (200) and the live ones (``live_simple`` 258, ``live_multiple``
1053, ``live_parallel`` 16, ``live_parallel_multiple`` 24), each with ``possible_answer/<same name>``.
Agreement with BFCL's own checker on all of them: ``test_tool_calling_bfcl_agreement_on_cpu``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_fns.tool_calling import compute_score
from reward_fns.tool_calling.bfcl_data import NON_LIVE_CATEGORIES, PYTHON_AST_CATEGORIES, BfclItem, load_bfcl_category
from reward_fns.tool_calling.parse import ToolCall
from reward_fns.tool_calling.reference import ToolCallingReference, gold_calls, parse_ground_truth
from reward_fns.tool_calling.render import render_python_call_list, render_tool_call_blocks

# BFCL items whose possible answers contradict their own schema, accepted through BFCL's rule that a
# value of the possible answer's type is accepted (see ``values``), as BFCL's checker accepts them:
ANSWER_TYPE_DIFFERS_FROM_SCHEMA = {
    # linear_regression_fit declares x and y as arrays of floats; the answers are the strings
    # "data['sales']" and "data['future_sales']" (variables).
    "parallel_multiple_21",
    # sort_list declares elements as an array of integers; the first call's answers are lists of fruit names.
    "parallel_multiple_94",
}


@functools.cache
def _items(category: str) -> tuple[BfclItem, ...]:
    return tuple(load_bfcl_category(category))


@functools.cache
def _reference(category: str, index: int) -> ToolCallingReference:
    return parse_ground_truth(_items(category)[index].ground_truth())


def _correctness(item: BfclItem, calls: list[ToolCall]) -> float:
    return float(compute_score("bfcl", render_tool_call_blocks(calls), item.ground_truth())["tool_correctness"])


def _gold(category: str, index: int) -> list[ToolCall]:
    return gold_calls(_reference(category, index))


def test_bfcl_files_are_where_expected() -> None:
    sizes = {category: len(_items(category)) for category in PYTHON_AST_CATEGORIES}
    assert sizes == {
        **{"simple_python": 400, "multiple": 200, "parallel": 200, "parallel_multiple": 200},
        **{"live_simple": 258, "live_multiple": 1053, "live_parallel": 16, "live_parallel_multiple": 24},
    }


@pytest.mark.parametrize("category", NON_LIVE_CATEGORIES)  # the live ones: the agreement test
@pytest.mark.parametrize("render", [render_tool_call_blocks, render_python_call_list])
def test_gold_answers_score_one(category: str, render: Any) -> None:
    failures = []
    for index, item in enumerate(_items(category)):
        result = compute_score(f"bfcl/{category}", render(_gold(category, index)), item.ground_truth())
        assert result["tool_format"] == 1.0, item.id
        if result["tool_correctness"] != 1.0:
            failures.append(item.id)
    assert failures == []


def test_answers_of_the_possible_answers_type_score_one() -> None:
    items = {item.id: (index, item) for index, item in enumerate(_items("parallel_multiple"))}
    for item_id in ANSWER_TYPE_DIFFERS_FROM_SCHEMA:
        index, item = items[item_id]
        assert _correctness(item, _gold("parallel_multiple", index)) == 1.0, item_id


def _with_arguments(call: ToolCall, arguments: dict[str, Any]) -> ToolCall:
    return dataclasses.replace(call, arguments=arguments)


def _first_argument(call: ToolCall, reference: ToolCallingReference, kind: str | None = None) -> str | None:
    """The first gold argument (alphabetically), optionally only one whose schema type is ``kind``."""
    schema = reference.schema_for(call.name)
    for argument in sorted(call.arguments):
        declared = schema.properties.get(argument, {}).get("type") if schema else None
        if kind is None or declared == kind:
            return argument
    return None


def _simple_cases() -> list[tuple[BfclItem, ToolCall, ToolCallingReference]]:
    return [
        (item, _gold("simple_python", index)[0], _reference("simple_python", index))
        for index, item in enumerate(_items("simple_python"))
    ]


def test_wrong_function_name_loses_exactly_the_name_third() -> None:
    for item, gold, _ in _simple_cases():
        renamed = dataclasses.replace(gold, name=gold.name + "_v2")
        assert _correctness(item, [renamed]) == pytest.approx(2 / 3), item.id


def test_missing_required_argument_costs_argument_names_and_values() -> None:
    checked = 0
    for item, gold, reference in _simple_cases():
        argument = _first_argument(gold, reference)
        if argument is None:
            continue
        given = len(gold.arguments)
        without = _with_arguments(gold, {k: v for k, v in gold.arguments.items() if k != argument})
        # s_args = s_value = (m - 1) / m with m gold arguments.
        expected = (1 + 2 * (given - 1) / given) / 3
        assert _correctness(item, [without]) == pytest.approx(expected), item.id
        checked += 1
    assert checked >= 390


def test_wrong_type_costs_one_value() -> None:
    checked = 0
    for item, gold, reference in _simple_cases():
        argument = _first_argument(gold, reference, kind="integer")
        if argument is None:
            continue
        as_text = _with_arguments(gold, {**gold.arguments, argument: str(gold.arguments[argument])})
        given = len(gold.arguments)
        assert _correctness(item, [as_text]) == pytest.approx((2 + (given - 1) / given) / 3), item.id
        checked += 1
    assert checked >= 150


def _wrong_value(value: Any) -> Any:
    """A value of the same type that no BFCL answer accepts."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 987654
    if isinstance(value, str):
        return value + " zebra"
    if isinstance(value, list):
        return [*value, value[0]] if value else ["zebra"]
    return {**value, "zebra": 1}


def test_wrong_value_costs_one_value() -> None:
    for item, gold, reference in _simple_cases():
        argument = _first_argument(gold, reference)
        if argument is None:
            continue
        changed = _with_arguments(gold, {**gold.arguments, argument: _wrong_value(gold.arguments[argument])})
        given = len(gold.arguments)
        assert _correctness(item, [changed]) == pytest.approx((2 + (given - 1) / given) / 3), item.id


def test_extra_argument_costs_argument_names_only() -> None:
    for item, gold, _ in _simple_cases():
        given = len(gold.arguments)
        padded = _with_arguments(gold, {**gold.arguments, "zebra_count": 3})
        assert _correctness(item, [padded]) == pytest.approx((1 + given / (given + 1) + 1) / 3), item.id


@pytest.mark.parametrize("category", ["multiple", "parallel", "parallel_multiple"])
def test_every_corruption_strictly_lowers_the_score(category: str) -> None:
    for index, item in enumerate(_items(category)):
        gold = _gold(category, index)
        first, rest = gold[0], gold[1:]
        argument = _first_argument(first, _reference(category, index))
        corruptions = [[dataclasses.replace(first, name="no_such_function"), *rest]]
        if argument is not None:
            without = {key: value for key, value in first.arguments.items() if key != argument}
            changed = {**first.arguments, argument: _wrong_value(first.arguments[argument])}
            corruptions += [[_with_arguments(first, without), *rest], [_with_arguments(first, changed), *rest]]
        for corrupted in corruptions:
            assert _correctness(item, corrupted) < 1.0, item.id


@pytest.mark.parametrize("category", ["parallel", "parallel_multiple"])
def test_missing_and_surplus_calls_on_parallel_items(category: str) -> None:
    for index, item in enumerate(_items(category)):
        gold = _gold(category, index)
        count = len(gold)
        assert _correctness(item, gold[1:]) == pytest.approx((count - 1) / count), item.id
        assert _correctness(item, [*gold, gold[0]]) == pytest.approx(count / (count + 1)), item.id


PARALLEL_INDICES = st.sampled_from(range(200))


@settings(max_examples=60, deadline=None)
@given(PARALLEL_INDICES, st.sampled_from(["parallel", "parallel_multiple"]), st.randoms(use_true_random=False))
def test_permuting_parallel_calls_never_changes_the_score(index: int, category: str, random: Any) -> None:
    item = _items(category)[index]
    calls = _gold(category, index)
    # Corrupt one call so that the invariance is checked on a score below 1 too.
    calls[0] = _with_arguments(calls[0], {**calls[0].arguments, "zebra_count": 3})
    shuffled = list(calls)
    random.shuffle(shuffled)
    assert _correctness(item, shuffled) == pytest.approx(_correctness(item, calls), abs=1e-12)

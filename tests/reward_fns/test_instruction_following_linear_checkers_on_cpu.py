"""The linear-time rewrites give the library checker's verdict on every response, and stay linear.

Responses are built from the pieces the checks look at (blank and whitespace-only lines, indents,
punctuation, words), so that both verdicts and every quirk of the library's remove-while-iterating
loop (which blank lines survive) are reached often.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reward_fns.instruction_following.checkers import checker_registry

# Bounds on wall or CPU time: run alone, after the two-worker part of `make test` (Makefile).
pytestmark = pytest.mark.serial

# ifbench is imported offline by the registry; the rewrites subclass its checkers, so they come after.
checker_registry()
REWRITES: dict[str, type] = importlib.import_module("reward_fns.instruction_following.linear_checkers").REWRITES

PIECES = ["", " ", "  ", "\t", "word", " word", "  word", "   two words", "a.b", "!!", ",", "x y", "  ", "\u3000"]
PIECES += ["[", "]", "[a]", "[ ]", "[[", "]]", "\r", "{[("]
line_lists = st.lists(st.sampled_from(PIECES) | st.text(" \tab.,!\n[]\r", max_size=6), max_size=40)
responses = line_lists.map("\n".join)
ARGUMENTS = {"detectable_content:number_placeholders": {"num_placeholders": 2}}
# The response that makes each library check slow: short paragraphs, or brackets that never close.
SLOW_UNIT = {"detectable_content:number_placeholders": "{[("}


def library_class(instruction_id: str) -> type:
    """The library's own checker: the class the rewrite derives from."""
    return REWRITES[instruction_id].__mro__[1]


def built(checker_class: type, instruction_id: str) -> Any:
    checker = checker_class(instruction_id)
    checker.build_description(**ARGUMENTS.get(instruction_id, {}))
    return checker


@settings(max_examples=1_500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@example(response="\n\n a\n\n  b\n\n\n   c", instruction_id="format:line_indent")
@example(response=" \n \n a\n  b", instruction_id="format:line_indent")
@example(response="a\n \n\n b", instruction_id="format:line_indent")
@example(response="a\n\n\nb.\n,\n", instruction_id="format:newline")
@example(response="[a] [\nb] [c\r] [[d]]", instruction_id="detectable_content:number_placeholders")
@given(response=responses, instruction_id=st.sampled_from(sorted(REWRITES)))
def test_the_rewrite_agrees_with_the_library(response: str, instruction_id: str) -> None:
    rewrite = built(REWRITES[instruction_id], instruction_id)
    original = built(library_class(instruction_id), instruction_id)
    assert rewrite.check_following(response) == original.check_following(response), repr(response)


@pytest.mark.parametrize("instruction_id", sorted(REWRITES))
def test_the_registry_serves_the_rewrite(instruction_id: str) -> None:
    assert checker_registry()[instruction_id] is REWRITES[instruction_id]


@pytest.mark.parametrize("instruction_id", sorted(REWRITES))
def test_the_rewrite_is_linear_where_the_library_is_quadratic(instruction_id: str) -> None:
    def seconds(size: int) -> float:
        unit = SLOW_UNIT.get(instruction_id, "word\n\n")
        text = (unit * (size // len(unit) + 1))[:size]
        checker = built(REWRITES[instruction_id], instruction_id)
        started = time.perf_counter()
        checker.check_following(text)
        return time.perf_counter() - started

    small, large = min(seconds(25_600) for _ in range(5)), min(seconds(256_000) for _ in range(5))
    # Ten times the text: linear is ~10x, the library's quadratic checks ~100x (4-5 s at 100-256 KiB).
    assert large < 0.5 and large < 30 * max(small, 5e-3), (instruction_id, small, large)

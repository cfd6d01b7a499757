"""Score model calls against reference calls: BFCL's AST-checker rules, made continuous.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/tool_calling/match.py``).
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]

from reward_fns.tool_calling.parse import ToolCall
from reward_fns.tool_calling.reference import ReferenceCall, ToolCallingReference
from reward_fns.tool_calling.source_values import PYTHON, read_source_value
from reward_fns.tool_calling.values import normalize_string, value_problem

__all__ = ["CallScore", "CallSetScore", "names_match", "normalize_string", "score_call", "score_calls"]

_SHORT_REPR = reprlib.Repr()  # Python 3.11's Repr takes no keyword arguments.
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxdict, _SHORT_REPR.maxstring = 3, 4, 4, 60


def names_match(model_name: str, reference_name: str) -> bool:
    """Exact match, or equal once dots are written as underscores (serving stacks often rename ``a.b``)."""
    return model_name == reference_name or model_name.replace(".", "_") == reference_name.replace(".", "_")


@dataclass(frozen=True)
class CallScore:
    """The three parts of one model call's score against one reference call.

    Attributes:
        name: 1.0 when the function names match.
        argument_names: the argument-name overlap ``s_args``.
        argument_values: the value accuracy ``s_value``.
        problems: short human-readable reasons for every point lost.
    """

    name: float
    argument_names: float
    argument_values: float
    problems: tuple[str, ...]

    @property
    def total(self) -> float:
        """``(s_name + s_args + s_value) / 3``."""
        return (self.name + self.argument_names + self.argument_values) / 3


def _short(value: Any) -> str:
    """A bounded ``repr``, so one huge or deeply nested argument cannot flood the verifier information."""
    return _SHORT_REPR.repr(value)


def _ratio(numerator: int, denominator: int) -> float:
    # Nothing to get right means nothing got wrong.
    return 1.0 if denominator == 0 else numerator / denominator


def score_call(
    call: ToolCall,
    reference: ReferenceCall,
    properties: Mapping[str, Mapping[str, Any]],
    language: str = PYTHON,
    source_nodes: Mapping[str, Mapping[str, Any]] | None = None,
) -> CallScore:
    """Score one model call against one reference call (formula in the module docstring).

    Args:
        call: the model's call.
        reference: the expected call.
        properties: the reference function's argument schemas (``{}`` when unknown).
        language: ``java`` / ``javascript``: values are source text, converted first (``source_values``).
        source_nodes: the argument schemas with the language's type names (Java / JavaScript).

    Returns:
        The score parts and the problems found.
    """
    given = set(call.arguments)
    known = set(reference.acceptable_values)
    if properties:  # BFCL: an argument the schema does not declare is unexpected too
        known &= set(properties)
    hits, missing, extra = given & known, reference.mandatory - given, given - known
    name_matches = names_match(call.name, reference.name)
    problems = [] if name_matches else [f"called {call.name!r} instead of {reference.name!r}"]
    problems += [f"{reference.name}: missing argument {name!r}" for name in sorted(missing)]
    problems += [f"{reference.name}: unexpected argument {name!r}" for name in sorted(extra)]
    correct = 0
    for argument in sorted(hits):
        value = call.arguments[argument]
        readable, converted = True, value
        if language != PYTHON and source_nodes and argument in source_nodes:
            readable, converted = read_source_value(language, value, source_nodes[argument])
        problem = (
            value_problem(converted, reference.acceptable_values[argument], properties.get(argument))
            if readable
            else "wrong type"
        )
        if not readable and type(value) is str:
            problems.append(f"{reference.name}.{argument}: {language} source text too long or a number too large")
        elif problem == "wrong type":
            problems.append(f"{reference.name}.{argument}: wrong type {type(value).__name__}")
        elif problem is not None:
            problems.append(f"{reference.name}.{argument}: wrong value {_short(value)}")
        else:
            correct += 1
    return CallScore(
        name=1.0 if name_matches else 0.0,
        argument_names=_ratio(len(hits), len(hits) + len(missing) + len(extra)),
        argument_values=_ratio(correct, len(hits | missing)),
        problems=tuple(problems),
    )


def _score_against(call: ToolCall, expected: ReferenceCall, reference: ToolCallingReference) -> CallScore:
    """``score_call`` with the expected function's schemas (none when no schema was given)."""
    schema = reference.schema_for(expected.name)
    if schema is None:
        return score_call(call, expected, {})
    return score_call(call, expected, schema.properties, reference.language, schema.source_nodes)


@dataclass(frozen=True)
class CallSetScore:
    """The score of all model calls against all reference calls.

    Attributes:
        correctness: ``tool_correctness`` in [0, 1].
        problems: reasons for every point lost, matched calls first.
    """

    correctness: float
    problems: tuple[str, ...]


def score_calls(calls: Sequence[ToolCall], reference: ToolCallingReference) -> CallSetScore:
    """Score a set of model calls, matching them to reference calls in the best order.

    Args:
        calls: the model's calls (any order).
        reference: the expected calls and function schemas.

    Returns:
        ``tool_correctness`` and the problems of the best assignment.
    """
    expected = reference.calls
    if not calls:
        return CallSetScore(correctness=0.0, problems=("no tool call",))
    scores = [[_score_against(call, ref, reference) for ref in expected] for call in calls]
    totals = np.array([[score.total for score in row] for row in scores])
    call_rows, reference_columns = linear_sum_assignment(totals, maximize=True)
    matched = list(zip(call_rows.tolist(), reference_columns.tolist(), strict=True))
    unmatched_calls = sorted(set(range(len(calls))) - set(call_rows.tolist()))
    unmatched_references = sorted(set(range(len(expected))) - set(reference_columns.tolist()))
    problems = [problem for row, column in matched for problem in scores[row][column].problems]
    problems += [f"unexpected extra call {calls[row].name!r}" for row in unmatched_calls]
    problems += [f"missing call {expected[column].name!r}" for column in unmatched_references]
    # fsum: the same matched scores give the same total whatever the order of the calls.
    total = math.fsum(sorted(scores[row][column].total for row, column in matched))
    return CallSetScore(correctness=total / max(len(calls), len(expected)), problems=tuple(problems))

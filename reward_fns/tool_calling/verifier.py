"""The tool-calling reward function: two reward components plus their verifier information.

A response longer than :data:`INLINE_MAX_CHARS` is parsed and matched in this family's worker
pool (``reward_fns.process_pool``) under the reward's wall-clock deadline ``timeout_s``; the ground
truth travels as JSON text, which each worker parses once and caches (a group's responses share
it). A shorter one, every real tool call, is checked in the calling thread: its check is linear in
its length and takes at most a few milliseconds, less than the pool's round trip.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from reward_fns.process_pool.deadline import DEFAULT_TIMEOUT_S, DeadlineSettings, run_task
from reward_fns.tool_calling.match import score_calls
from reward_fns.tool_calling.parse import parse_response
from reward_fns.tool_calling.reference import ToolCallingReference, parse_ground_truth
from reward_fns.tool_calling.render import EXPECTED_FORMAT, render_reference
from reward_fns.total import total_over_responses

REWARD_KEYS: tuple[str, ...] = ("tool_format", "tool_correctness")
TASKS_MODULE = "reward_fns.tool_calling.tasks"
INLINE_MAX_CHARS = 4096
"""Longest response checked in the calling thread: a check of this size (the slowest 4 KiB answer: a Python
call list, every BFCL category, ``tests/reward_fns/test_checker_growth_on_cpu.py``) stays far under the
deadline even with many threads contending for the GIL, and costs about as much as the pool's round trip
(timings: docs/reward_fns.md)."""
_PROBLEMS_SHOWN = 20  # the info string goes into a replay prompt: keep it short


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars, as parquet and pandas give them
        return value.tolist()
    raise TypeError(f"a tool-calling ground truth holds a {type(value).__name__}, which is not JSON data")


def ground_truth_text(ground_truth: Any) -> str:
    """The ground truth as JSON text (a string is kept as it is: JSON or ``<tool_call>`` blocks)."""
    if isinstance(ground_truth, str):
        return ground_truth
    return json.dumps(ground_truth, default=_plain, ensure_ascii=False)


def read_ground_truth(arguments: Mapping[str, Any]) -> ToolCallingReference:
    """The reference of a ``compute_score`` call (its arguments by name); raises on a malformed one."""
    return parse_ground_truth(ground_truth_text(arguments.get("ground_truth")))


@total_over_responses("tool_calling", read_ground_truth=read_ground_truth, reward_keys=lambda arguments: REWARD_KEYS)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    isolation: str = "process",
    sandbox_workers: int | None = None,
    sandbox_memory_bytes: int | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response to a tool-calling prompt.

    Components:

    * ``tool_format`` (0 or 1): the response is well-formed — every
      ``<tool_call>`` block parses and every call has a name and an arguments
      object (or, without blocks, the response is a literal Python call list);
      see ``parse``.
    * ``tool_correctness`` (continuous, [0, 1]): function names, argument names
      and argument values against the reference under BFCL's rules, best
      assignment over parallel calls; see ``match``. A malformed response
      scores 0 here too, since its calls cannot be read reliably.
    * ``score`` = mean of the two, so a correct answer scores exactly 1.

    Args:
        data_source: the sample's data source (unused; the dispatcher routes on it).
        solution_str: the decoded response.
        ground_truth: the reference, any form ``reference.parse_ground_truth`` accepts.
        extra_info: unused.
        timeout_s: wall-clock deadline for parsing and matching a response longer than
            :data:`INLINE_MAX_CHARS`; past it the response scores 0 and ``reward/tool_calling/timeouts`` is 1.
        isolation: ``"process"`` (the family's worker pool; the default) or ``"inprocess"`` (no
            deadline; for measuring the pool's cost only).
        sandbox_workers: worker processes of the pool (default ``min(32, os.cpu_count() + 4)``).
        sandbox_memory_bytes: address-space limit of each worker.
        **kwargs: ignored, for forward compatibility with verl's reward loop.

    Returns:
        ``score``, ``tool_format``, ``tool_correctness``, ``tool_format_info``
        (the format specification, plus the problem when malformed) and
        ``tool_correctness_info`` (function names and reference calls, plus the
        problems found in this response).

        The ``total_over_responses`` wrapper adds ``reward/tool_calling/internal_errors``
        (1.0 when this function failed on the response, which then scores 0).

    Raises:
        reward_fns.total.GroundTruthError: the ground truth is malformed (a ValueError naming
            data_source and extra_info's index); never raised because of the response.
    """
    settings = DeadlineSettings.from_kwargs(timeout_s, isolation, sandbox_workers, sandbox_memory_bytes)
    request = {"ground_truth": ground_truth_text(ground_truth), "response": solution_str}
    if isinstance(solution_str, str) and len(solution_str) <= INLINE_MAX_CHARS:
        return score_response(**request)
    return run_task(TASKS_MODULE, "tool-calling", "score", request, settings)  # type: ignore[no-any-return]


def score_response(ground_truth: str, response: str) -> dict[str, Any]:
    """The reward dict of one response, computed here (the worker's task; see :func:`compute_score`)."""
    reference = parse_ground_truth(ground_truth)
    reference_text = render_reference(reference)
    parsed = parse_response(response)
    if not parsed.well_formed:
        tool_format, tool_correctness = 0.0, 0.0
        format_info = f"{EXPECTED_FORMAT}\nProblem: {parsed.error}"
        correctness_info = f"{reference_text}\nProblems: no readable tool call"
    else:
        call_set_score = score_calls(parsed.calls, reference)
        tool_format, tool_correctness = 1.0, call_set_score.correctness
        format_info = EXPECTED_FORMAT
        shown = call_set_score.problems[:_PROBLEMS_SHOWN]
        hidden = len(call_set_score.problems) - len(shown)
        problems = "; ".join(shown) + (f"; ... and {hidden} more" if hidden else "")
        correctness_info = f"{reference_text}\nProblems: {problems}" if problems else reference_text
    return {
        "score": (tool_format + tool_correctness) / 2,
        "tool_format": tool_format,
        "tool_correctness": tool_correctness,
        "tool_format_info": format_info,
        "tool_correctness_info": correctness_info,
    }

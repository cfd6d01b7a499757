"""The tool-calling reward function: two reward components plus their verifier information."""

from __future__ import annotations

from typing import Any

from reward_fns.tool_calling.match import score_calls
from reward_fns.tool_calling.parse import parse_response
from reward_fns.tool_calling.reference import parse_ground_truth
from reward_fns.tool_calling.render import EXPECTED_FORMAT, render_reference
from reward_fns.total import total_over_responses

REWARD_KEYS: tuple[str, ...] = ("tool_format", "tool_correctness")
_PROBLEMS_SHOWN = 20  # the info string goes into a replay prompt: keep it short


@total_over_responses("tool_calling")
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
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
    reference = parse_ground_truth(ground_truth)
    reference_text = render_reference(reference)
    parsed = parse_response(solution_str)
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

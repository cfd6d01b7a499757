"""Text renderings: tool calls as a model would write them, references as verifier information."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from reward_fns.tool_calling.parse import ToolCall
from reward_fns.tool_calling.reference import OPTIONAL_MARKER, ReferenceCall, ToolCallingReference, gold_calls
from reward_fns.tool_calling.source_values import PYTHON

EXPECTED_FORMAT = (
    "Expected format: one or more <tool_call>...</tool_call> blocks, each holding a JSON object "
    '{"name": <function name>, "arguments": {<argument>: <value>, ...}} or a JSON list of such objects '
    "(a bare Python call list such as [f(a=1)] is also accepted). Every call needs a name and an arguments object."
)


def render_tool_call_blocks(calls: Sequence[ToolCall]) -> str:
    """Write calls in the primary format, one ``<tool_call>`` block per call (Hermes / Qwen style).

    Args:
        calls: the calls to write.

    Returns:
        The response text.
    """
    return "\n".join(
        f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n</tool_call>" for call in calls
    )


def render_python_call_list(calls: Sequence[ToolCall]) -> str:
    """Write calls in BFCL's Python style, e.g. ``[f(a=1, b='x')]``.

    Args:
        calls: the calls to write.

    Returns:
        The response text.
    """
    rendered = [
        f"{call.name}({', '.join(f'{key}={value!r}' for key, value in call.arguments.items())})" for call in calls
    ]
    return f"[{', '.join(rendered)}]"


def _literal(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


def _render_value(value: Any) -> str:
    """An acceptable value: a dict pattern as ``{key: a | b}`` (its alternatives literal JSON), else JSON."""
    if isinstance(value, Mapping) and all(isinstance(items, list) for items in value.values()):
        entries = (f"{_literal(key)}: {_render_alternatives(items, _literal)}" for key, items in value.items())
        return "{" + ", ".join(entries) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_render_value(item) for item in value) + "]"
    return _literal(value)


def _render_alternatives(alternatives: Sequence[Any], render: Any = _render_value) -> str:
    """``a | b``, with ``(optional)`` when ``""`` is among them."""
    shown = " | ".join(render(value) for value in alternatives if value != OPTIONAL_MARKER)
    if OPTIONAL_MARKER in alternatives:
        return f"{shown} (optional)" if shown else "(optional)"
    return shown


def render_reference_call(call: ReferenceCall) -> str:
    """One reference call compactly, e.g. ``area(base=10, unit="units" | "cm" (optional))``.

    Args:
        call: the reference call.

    Returns:
        One line.
    """
    arguments = ", ".join(f"{name}={_render_alternatives(values)}" for name, values in call.acceptable_values.items())
    return f"{call.name}({arguments})"


def render_reference(reference: ToolCallingReference) -> str:
    """The verifier information of ``tool_correctness``: the function names and the reference calls.

    Args:
        reference: the normalised ground truth.

    Returns:
        Two short lines; for Java / JavaScript a third, one accepted answer with its values as
        source text (the reference lists the values after conversion).
    """
    functions = ", ".join(function.name for function in reference.functions) or "(no schemas given)"
    calls = "; ".join(render_reference_call(call) for call in reference.calls)
    order_note = " (any order)" if len(reference.calls) > 1 else ""
    text = f"Functions: {functions}\nReference call(s){order_note}: {calls}"
    if reference.language != PYTHON:
        written = "; ".join(
            _literal({"name": call.name, "arguments": call.arguments}) for call in gold_calls(reference)
        )
        text += f"\nValues are {reference.language} source text; one accepted answer: {written}"
    return text

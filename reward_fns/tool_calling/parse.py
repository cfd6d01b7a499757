"""Read tool calls out of a model response. Everything in the response is data.

Primary format (Qwen / Hermes chat templates)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

A block may hold one JSON object, a JSON list of objects, or one object per
line (ToolRL writes its references that way); ``"parameters"`` is accepted as a
synonym of ``"arguments"``. Several blocks are concatenated.

Fallback (BFCL's prompt style), used only when the response has no block:
the whole response is a Python call list such as ``[get_weather(city="Paris")]``.
It is read with ``ast.parse`` and only literal argument nodes are evaluated
(``ast.literal_eval``); the callee must be a plain dotted name. Nothing from the
response is ever executed.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any

_OPEN_TAG = "<tool_call>"
_CLOSE_TAG = "</tool_call>"
# Reasoning may mention tags it does not mean; only the answer after it counts.
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_CODE_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```$", re.DOTALL)
_ARGUMENT_KEYS = ("arguments", "parameters")
MAX_CALLS = 128
"""Most calls one response may make; more is malformed (scoring is quadratic in the calls)."""


class ToolCallFormatError(ValueError):
    """The response is not a well-formed tool call; the message says why."""


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it.

    Attributes:
        name: function name.
        arguments: argument name → value (JSON types; Python tuples become lists).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParsedResponse:
    """The calls found in a response, or why none could be read.

    Attributes:
        calls: the calls in order of appearance (empty when ``error`` is set).
        error: None for a well-formed response, else a one-line reason.
    """

    calls: tuple[ToolCall, ...] = ()
    error: str | None = None

    @property
    def well_formed(self) -> bool:
        """True when the response parsed into at least one call."""
        return self.error is None


def _call_from_json_object(candidate: Any, position: str) -> ToolCall:
    """Validate one decoded JSON value as ``{"name": str, "arguments": dict}``."""
    if not isinstance(candidate, dict):
        raise ToolCallFormatError(f"{position}: a call must be a JSON object, got {type(candidate).__name__}")
    name = candidate.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolCallFormatError(f'{position}: missing or empty "name"')
    argument_key = next((key for key in _ARGUMENT_KEYS if key in candidate), None)
    if argument_key is None:
        raise ToolCallFormatError(f'{position}: call {name!r} has no "arguments"')
    arguments = candidate[argument_key]
    if not isinstance(arguments, dict):
        raise ToolCallFormatError(
            f'{position}: "arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}'
        )
    return ToolCall(name=name.strip(), arguments=arguments)


def _decode_json_values(text: str) -> list[Any]:
    """Decode a block as one JSON value, or else as one JSON value per non-empty line."""
    try:
        return [json.loads(text)]
    except (ValueError, RecursionError) as whole_error:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise ToolCallFormatError(f"invalid JSON: {whole_error}") from None
        try:
            return [json.loads(line) for line in lines]
        except (ValueError, RecursionError):
            # The whole-block error points at the real problem more often than a per-line one.
            raise ToolCallFormatError(f"invalid JSON: {whole_error}") from None


def parse_json_calls(text: str, position: str = "block") -> list[ToolCall]:
    """Parse the content of one ``<tool_call>`` block written as JSON.

    Args:
        text: the block content (a JSON object, a JSON list of objects, or JSON lines).
        position: where the block is, for error messages.

    Returns:
        The calls, in order.

    Raises:
        ToolCallFormatError: the content is not JSON or a call is malformed.
    """
    try:
        values = _decode_json_values(text.strip())
    except ToolCallFormatError as error:
        raise ToolCallFormatError(f"{position}: {error}") from None
    calls: list[ToolCall] = []
    for value in values:
        candidates = value if isinstance(value, list) else [value]
        calls.extend(_call_from_json_object(candidate, position) for candidate in candidates)
    return calls


def _dotted_name(node: ast.expr) -> str:
    """``a.b.c`` for a chain of plain names; anything else (calls, subscripts) is refused."""
    attributes: list[str] = []
    # A loop, not recursion: the chain length is chosen by the model.
    while isinstance(node, ast.Attribute):
        attributes.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ToolCallFormatError(f"callee must be a plain dotted name, got {type(node).__name__} expression")
    return ".".join([node.id, *reversed(attributes)])


def _as_json_data(value: Any) -> Any:
    """Turn a Python literal into JSON-like data (tuples become lists); refuse non-JSON literals."""
    if isinstance(value, tuple | list):
        return [_as_json_data(item) for item in value]
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise ToolCallFormatError("dict argument keys must be strings")
        return {key: _as_json_data(item) for key, item in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise ToolCallFormatError(f"argument literal of type {type(value).__name__} is not JSON data")


def _call_from_python_node(node: ast.expr) -> ToolCall:
    """Read one ``name(keyword=literal, ...)`` node without evaluating anything but literals."""
    if not isinstance(node, ast.Call):
        raise ToolCallFormatError(f"list element is a {type(node).__name__}, not a call")
    name = _dotted_name(node.func)
    if node.args:
        raise ToolCallFormatError(f"call {name!r} uses positional arguments; keyword arguments are required")
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ToolCallFormatError(f"call {name!r} uses **kwargs unpacking")
        try:
            literal = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise ToolCallFormatError(f"argument {keyword.arg!r} of {name!r} is not a literal") from None
        arguments[keyword.arg] = _as_json_data(literal)
    return ToolCall(name=name, arguments=arguments)


def parse_python_calls(text: str) -> list[ToolCall]:
    """Parse a Python call list such as ``[f(a=1), g.h(b="x")]`` (a single call is also accepted).

    Args:
        text: the source text, optionally inside a Markdown code fence.

    Returns:
        The calls, in order.

    Raises:
        ToolCallFormatError: not Python syntax, not a list of calls, or a non-literal argument.
    """
    source = text.strip()
    fenced = _CODE_FENCE.match(source)
    if fenced:
        source = fenced.group(1).strip()
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
        raise ToolCallFormatError(f"Python syntax error ({type(error).__name__})") from None
    body = tree.body
    nodes = body.elts if isinstance(body, ast.List) else [body]
    return [_call_from_python_node(node) for node in nodes]


def _parse_block(content: str, index: int) -> list[ToolCall]:
    """JSON first; a block that is not JSON may still be a Python call list."""
    try:
        return parse_json_calls(content, position=f"block {index}")
    except ToolCallFormatError as json_error:
        try:
            return parse_python_calls(content)
        except ToolCallFormatError as python_error:
            raise ToolCallFormatError(f"{json_error}; read as Python: {python_error}") from None


def _without_think_sections(text: str) -> str:
    """Drop every ``<think>...</think>`` section (and nothing of an unclosed one).

    A scan with ``str.find``, not a lazy regex: ``<think>`` repeated without a close would make
    the regex quadratic (seconds on a 256 KiB response).
    """
    kept, position = [], 0
    while (start := text.find(_THINK_OPEN, position)) != -1:
        end = text.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end == -1:
            break
        kept.append(text[position:start])
        position = end + len(_THINK_CLOSE)
    kept.append(text[position:])
    return "".join(kept)


def _tool_call_blocks(text: str) -> list[str]:
    """The contents of the ``<tool_call>`` blocks, in linear time; unbalanced or nested tags are an error."""
    blocks, position = [], 0
    while (start := text.find(_OPEN_TAG, position)) != -1:
        content_start = start + len(_OPEN_TAG)
        end = text.find(_CLOSE_TAG, content_start)
        if end == -1 or _OPEN_TAG in text[content_start:end]:
            raise ToolCallFormatError("unbalanced <tool_call> ... </tool_call> tags")
        blocks.append(text[content_start:end])
        position = end + len(_CLOSE_TAG)
    if text.count(_CLOSE_TAG) != len(blocks):
        raise ToolCallFormatError("unbalanced <tool_call> ... </tool_call> tags")
    return blocks


def _parse_calls(text: str) -> list[ToolCall]:
    """All calls of a response with its reasoning already removed."""
    if _OPEN_TAG not in text and _CLOSE_TAG not in text:
        try:
            return parse_python_calls(text)
        except ToolCallFormatError as error:
            raise ToolCallFormatError(f"no <tool_call> block, and not a Python call list: {error}") from None
    blocks = _tool_call_blocks(text)
    calls: list[ToolCall] = []
    for index, content in enumerate(blocks, start=1):
        calls.extend(_parse_block(content, index))
    return calls


def parse_response(response: Any) -> ParsedResponse:
    """Parse a whole model response into tool calls; never raises on bad input.

    Args:
        response: the decoded response text (anything else is malformed).

    Returns:
        The calls, or an error saying why the response is not a well-formed
        tool call (no block, bad JSON, missing name, arguments not an object,
        non-literal Python, no call at all, more than ``MAX_CALLS`` calls).
    """
    if not isinstance(response, str):
        return ParsedResponse(error=f"response is a {type(response).__name__}, not text")
    try:
        calls = _parse_calls(_without_think_sections(response))
    except ToolCallFormatError as error:
        return ParsedResponse(error=str(error))
    except RecursionError:
        return ParsedResponse(error="the response is nested too deeply to read")
    if not calls:
        return ParsedResponse(error="the response holds no tool call")
    if len(calls) > MAX_CALLS:
        return ParsedResponse(error=f"the response makes {len(calls)} calls, more than {MAX_CALLS}")
    return ParsedResponse(calls=tuple(calls))

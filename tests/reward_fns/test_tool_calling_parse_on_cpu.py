"""Format checks: what counts as a well-formed tool call, and that model text is never executed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_fns.tool_calling import compute_score
from reward_fns.tool_calling.parse import ToolCall, parse_response

GROUND_TRUTH = {
    "functions": [
        {
            "name": "get_weather",
            "parameters": {
                "type": "dict",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        }
    ],
    "answers": [{"get_weather": {"city": ["Paris"], "days": [3, ""]}}],
}


def _format_score(response: str) -> float:
    return float(compute_score("bfcl", response, GROUND_TRUTH)["tool_format"])


@pytest.mark.parametrize(
    "response",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>',
        'Let me check.\n<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>',
        "<think>I could write <tool_call> here.</think>"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        '[get_weather(city="Paris")]',
        '```python\n[get_weather(city="Paris")]\n```',
        '<tool_call>[get_weather(city="Paris")]</tool_call>',
    ],
)
def test_accepted_formats_parse_to_the_same_call(response: str) -> None:
    parsed = parse_response(response)
    assert parsed.error is None
    assert parsed.calls == (ToolCall("get_weather", {"city": "Paris"}),)
    assert compute_score("bfcl", response, GROUND_TRUTH)["score"] == 1.0


def test_several_blocks_and_json_lines_concatenate_in_order() -> None:
    two_blocks = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    )
    json_lines = '<tool_call>\n{"name": "a", "arguments": {}}\n{"name": "b", "arguments": {"x": 1}}\n</tool_call>'
    expected = (ToolCall("a", {}), ToolCall("b", {"x": 1}))
    assert parse_response(two_blocks).calls == expected
    assert parse_response(json_lines).calls == expected


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("The weather in Paris is sunny.", "no <tool_call> block"),
        ("", "no <tool_call> block"),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}</tool_call>', "invalid JSON"),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}', "unbalanced"),
        ('<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "", "arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "get_weather"}</tool_call>', '"arguments"'),
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "get_weather", "arguments": ["Paris"]}</tool_call>', "JSON object"),
        ("<tool_call>[]</tool_call>", "no tool call"),
        ("<tool_call>[1, 2]</tool_call>", "JSON object"),
        ('[get_weather("Paris")]', "positional"),
        ("[get_weather(**{'city': 'Paris'})]", "**kwargs"),
        ("[get_weather(city=city_name)]", "not a literal"),
        ("[get_weather(city={1, 2})]", "not JSON data"),
        ("[get_weather(city='Paris'), 42]", "not a call"),
        ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>oops</tool_call>', "block 2"),
    ],
)
def test_malformed_responses_score_zero_with_a_reason(response: str, reason: str) -> None:
    result = compute_score("bfcl", response, GROUND_TRUTH)
    assert (result["tool_format"], result["tool_correctness"], result["score"]) == (0.0, 0.0, 0.0)
    assert reason in result["tool_format_info"]
    assert result["tool_format_info"].startswith("Expected format:")


def test_non_text_response_is_malformed_not_an_exception() -> None:
    result = compute_score("bfcl", None, GROUND_TRUTH)  # type: ignore[arg-type]
    assert result["tool_format"] == 0.0
    assert "not text" in result["tool_format_info"]


INJECTIONS = [
    "[__import__('os').system('touch {marker}')(a=1)]",
    "[get_weather(city=__import__('os').system('touch {marker}'))]",
    "[get_weather(city=(lambda: __import__('os').system('touch {marker}'))())]",
    "[get_weather(city=open('{marker}', 'w'))]",
    "[getattr(__import__('os'), 'system')('touch {marker}')]",
    "[get_weather(city=[x for x in __import__('os').system('touch {marker}')])]",
    "<tool_call>[__import__('os').system('touch {marker}')(a=1)]</tool_call>",
    "__import__('os').system('touch {marker}')",
]


@pytest.mark.parametrize("template", INJECTIONS)
def test_code_in_the_response_is_parsed_as_data_and_never_run(
    template: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "executed"

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("model output was executed")

    monkeypatch.setattr(os, "system", refuse)
    result = compute_score("bfcl", template.format(marker=marker), GROUND_TRUTH)
    assert result["tool_format"] == 0.0
    assert result["tool_correctness"] == 0.0
    assert not marker.exists()


def test_python_literals_become_json_data() -> None:
    parsed = parse_response("[math.hypot(point=(3, 4.5), flags=[True, None], meta={'k': (1,)}, n=-2)]")
    assert parsed.calls == (
        ToolCall("math.hypot", {"point": [3, 4.5], "flags": [True, None], "meta": {"k": [1]}, "n": -2}),
    )


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises(response: str) -> None:
    parsed = parse_response(response)
    assert parsed.well_formed == bool(parsed.calls)


FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    '{"name": "f"',
    ', "arguments": {',
    "}",
    "[",
    "]",
    "f(",
    "a=1",
    ")",
    ",",
    '"x"',
    "\n",
    "__import__('os')",
    "**",
    "lambda: 0",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join))
def test_tool_call_shaped_noise_never_raises(response: str) -> None:
    result = compute_score("bfcl", response, GROUND_TRUTH)
    assert result["tool_format"] in (0.0, 1.0)
    assert 0.0 <= result["tool_correctness"] <= 1.0


@pytest.mark.parametrize(
    "response",
    [
        "[" + "a." * 100_000 + "f(x=1)]",
        "[f(x=" + "[" * 5_000 + "]" * 5_000 + ")]",
        "<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>",
    ],
)
def test_deeply_nested_responses_are_malformed_not_a_crash(response: str) -> None:
    result = compute_score("bfcl", response, GROUND_TRUTH)
    assert result["tool_format"] == 0.0

"""Java / JavaScript argument values: our reading of source text against BFCL's own converters.

BFCL's ``java_type_converter`` and ``js_type_converter`` (the installed ``bfcl-eval``) are the
oracle: for every type name each language converts, every item type of its arrays, and about 4,000
texts (the gold source text of every argument of ``simple_java`` and ``simple_javascript``, a dozen
mutations of each, and hand-picked edge cases), our ``java_value`` / ``javascript_value`` must give
the same value of the same Python type, or fail where BFCL's converter fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from reward_fns.tool_calling import compute_score
from reward_fns.tool_calling.bfcl_data import load_bfcl_category
from reward_fns.tool_calling.reference import gold_calls, parse_ground_truth
from reward_fns.tool_calling.render import render_tool_call_blocks
from reward_fns.tool_calling.source_values import (
    JAVA_KINDS,
    JAVASCRIPT_KINDS,
    MAX_COLLECTION_CHARS,
    java_source,
    java_value,
    javascript_source,
    javascript_value,
    read_source_value,
)

EDGE_CASES = [
    *("", " ", "true", "false", "True", "null", "'", '"', "'a'", '"a"', "x", "1", "-1", "-0", "00", "1_000"),
    *("١٢", "nan", "inf", "1.", ".5", "1e", "1.5", "1e3", "1.5E-3", "1.5f", "1.5F", "3f", "1.5e+3f", "5L", "5l"),
    *("5n", "-5n", "1.5\n", "5L\n", "5\n", "true ", "9" * 5000),
    *("new int[]{1, 2, 3}", 'new String[]{"a", b}', "new int[]{}", "new int[] { , 1 , }", "x new int[]{1} y"),
    *('new ArrayList<>(Arrays.asList("a", "b"))', "new ArrayList<Integer>(Arrays.asList(1, 2))"),
    *("new ArrayList<>()", 'new ArrayList<String>() {{ add("a"); add("b"); }}', "new HashMap<>()"),
    'new HashMap<String, Object>() {{ put("k", 1); put("j", "v"); put("b", true); put("l", 5L); put("f", 1.5f); }}',
    *("new HashMap<>() {{}}", "new HashMap<>() {}", "[1, 2, 3]", "['a', \"b\", c]", "[[1, 2], [3, 4]]", "[[]]"),
    *("new Array(1, 2)", "new Array([1], [2])", "new Array()", "[]", "[ ]", "[1, 'a,b']", "[[1,2],[3]] x", "{}"),
    *("{'a': 1, 'b': 'x', c: [1, 2], d: {e: 1}}", "{a: 1, b}", "{a:1}", " {a: 1} ", "{'k': '5'}"),
    '{"k": "v", "j": ["a", "b"]}',
]


def _mutations(text: str) -> list[str]:
    """Near misses of a correct text: spacing, case, suffixes, quoting, truncation, separators."""
    return [
        *(text, text + " ", " " + text, text.upper(), text + "L", text + "f", text + "n", text[:-1], text[1:]),
        *(text.replace(", ", ","), text + ")", text.replace('"', "'"), f'"{text}"', "x" + text),
    ]


@cache
def texts() -> tuple[str, ...]:
    found = set(EDGE_CASES)
    for category in ("simple_java", "simple_javascript"):
        for item in load_bfcl_category(category):
            try:
                reference = parse_ground_truth(item.ground_truth())
            except ValueError:
                continue  # the unsatisfiable items (test_tool_calling_bfcl_agreement_on_cpu)
            for call in gold_calls(reference):
                for value in call.arguments.values():
                    found.update(_mutations(value))
    return tuple(sorted(found))


def _typed(value: Any) -> Any:
    """The value with the Python type of every part, so that 1, 1.0 and True differ."""
    if isinstance(value, list):
        return ["list", [_typed(item) for item in value]]
    if isinstance(value, dict):
        return ["dict", {key: _typed(item) for key, item in value.items()}]
    if isinstance(value, float) and math.isnan(value):
        return ["float", "nan"]
    return [type(value).__name__, value]


def _outcome(convert: Callable[..., Any], *arguments: Any) -> Any:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # BFCL prints some parse errors
            return _typed(convert(*arguments))
    except Exception as error:  # the converter's failure is an outcome to agree on
        return ["raises", type(error).__name__]


def _bfcl_converters() -> dict[str, Callable[..., Any]]:
    from bfcl_eval.eval_checker.ast_eval.type_convertor.java_type_converter import java_type_converter
    from bfcl_eval.eval_checker.ast_eval.type_convertor.js_type_converter import js_type_converter

    return {"java": java_type_converter, "javascript": js_type_converter}


@pytest.mark.parametrize(
    ("language", "ours", "kinds"),
    [("java", java_value, JAVA_KINDS), ("javascript", javascript_value, JAVASCRIPT_KINDS)],
)
def test_source_reading_agrees_with_bfcl_converters(
    language: str, ours: Callable[..., Any], kinds: dict[str, str]
) -> None:
    theirs = _bfcl_converters()[language]
    checked, differences = 0, []
    for type_name, kind in kinds.items():
        for item_type in list(kinds) if kind == "array" else [None]:
            for text in texts():
                mine, bfcl = _outcome(ours, text, type_name, item_type), _outcome(theirs, text, type_name, item_type)
                checked += 1
                # Both fail (BFCL raises ValueError there too: an int of over 4300 digits), or both agree.
                if mine != bfcl and not (mine[0] == "raises" and bfcl[0] == "raises"):
                    differences.append(f"{type_name}[{item_type}] {text!r}: ours {mine}, BFCL {bfcl}")
    print(f"{language}: {checked} (text, type) readings compared")
    assert differences == []
    assert checked > 50_000


@pytest.mark.parametrize(
    ("text", "type_name", "item_type", "expected"),
    [
        ("42L", "long", None, 42),
        ("42", "long", None, "42"),
        ("2.5f", "float", None, 2.5),
        ("2.5", "float", None, "2.5"),
        ("2.5", "double", None, 2.5),
        ('"quoted"', "String", None, '"quoted"'),  # a Java String is never unquoted
        ('new String[]{"a", b}', "Array", "String", ['"a"', "b"]),  # nor are Array items
        ('new ArrayList<>(Arrays.asList("a", "b"))', "ArrayList", "String", ["a", "b"]),
        ('new HashMap<String, Object>() {{ put("n", 5L); put("s", "x"); }}', "HashMap", None, {"n": 5, "s": "x"}),
    ],
)
def test_java_rules_of_the_docstring(text: str, type_name: str, item_type: str | None, expected: Any) -> None:
    assert _typed(java_value(text, type_name, item_type)) == _typed(expected)


@pytest.mark.parametrize(
    ("text", "type_name", "item_type", "expected"),
    [
        ("'quoted'", "String", None, "quoted"),
        ("7n", "Bigint", None, 7),
        ("1e3", "float", None, "1e3"),  # no exponent in BFCL's JavaScript float
        ("[1.5, 2]", "array", "float", [1.5, 2.0]),
        ("[[1, 'a'], [2]]", "array", "array", [[1, "a"], [2]]),
        ("{a: 1, 'b': \"x\", c: [true]}", "dict", None, {"a": 1, "b": "x", "c": [True]}),
    ],
)
def test_javascript_rules_of_the_docstring(text: str, type_name: str, item_type: str | None, expected: Any) -> None:
    assert _typed(javascript_value(text, type_name, item_type)) == _typed(expected)


@pytest.mark.parametrize(
    ("value", "type_name", "item_type"),
    [
        *((3, "long", None), (2.5, "float", None), (1e-05, "double", None), (True, "boolean", None)),
        *((["a", "b"], "ArrayList", "String"), ([1, 2], "Array", "integer"), ({"k": "v", "n": 3}, "HashMap", None)),
    ],
)
def test_java_source_reads_back(value: Any, type_name: str, item_type: str | None) -> None:
    assert _typed(java_value(java_source(value, type_name, item_type), type_name, item_type)) == _typed(value)


@pytest.mark.parametrize(
    ("value", "type_name", "item_type"),
    [
        *(("x", "String", None), (1e-05, "float", None), (12, "Bigint", None), (["a", "b"], "array", "String")),
        *(([0.5, 2.0], "array", "float"), ({"k": "v", "n": [1, 2]}, "dict", None)),
    ],
)
def test_javascript_source_reads_back(value: Any, type_name: str, item_type: str | None) -> None:
    written = javascript_source(value, type_name, item_type)
    assert _typed(javascript_value(written, type_name, item_type)) == _typed(value)


JAVA_TRUTH = {
    "language": "java",
    "functions": [
        {
            "name": "Cache.put",
            "description": "Store entries.",
            "parameters": {
                "type": "dict",
                "properties": {
                    "ttl": {"type": "long", "description": "Seconds."},
                    "keys": {"type": "ArrayList", "items": {"type": "String"}, "description": "Keys."},
                },
                "required": ["ttl", "keys"],
            },
        }
    ],
    "answers": [{"Cache.put": {"ttl": [60], "keys": [["a", "b"]]}}],
}


def _score(arguments: dict[str, Any], truth: Any = None) -> dict[str, Any]:
    response = json.dumps({"name": "Cache.put", "arguments": arguments})
    return compute_score("bfcl/simple_java", f"<tool_call>\n{response}\n</tool_call>", truth or JAVA_TRUTH)


def test_java_answers_are_scored_after_conversion() -> None:
    gold = gold_calls(parse_ground_truth(JAVA_TRUTH))
    assert gold[0].arguments == {"ttl": "60L", "keys": 'new ArrayList<>(Arrays.asList("a", "b"))'}
    assert compute_score("bfcl/simple_java", render_tool_call_blocks(gold), JAVA_TRUTH)["tool_correctness"] == 1.0
    also_right = _score({"ttl": "60L", "keys": 'new ArrayList<String>() {{ add("A"); add("b"); }}'})
    assert also_right["tool_correctness"] == 1.0
    plain_python = _score({"ttl": 60, "keys": ["a", "b"]})
    assert plain_python["tool_correctness"] < 1.0
    assert "Cache.put.ttl: wrong type int" in plain_python["tool_correctness_info"]
    no_suffix = _score({"ttl": "60", "keys": 'new ArrayList<>(Arrays.asList("a", "b"))'})
    assert no_suffix["tool_correctness"] < 1.0 and "Cache.put.ttl: wrong" in no_suffix["tool_correctness_info"]
    # The verifier information shows the values as the model must write them.
    written = (
        '{"name": "Cache.put", "arguments": {"ttl": "60L", "keys": "new ArrayList<>(Arrays.asList(\\"a\\", \\"b\\"))"}}'
    )
    assert f"Values are java source text; one accepted answer: {written}" in no_suffix["tool_correctness_info"]


def test_collections_over_the_length_limit_are_not_read() -> None:
    """BFCL's patterns take quadratic time on long texts: a longer collection is the wrong type."""
    keys = ", ".join(['"a"'] * (MAX_COLLECTION_CHARS // 6))
    within = f"new ArrayList<>(Arrays.asList({keys}))"
    assert len(within) <= MAX_COLLECTION_CHARS
    assert read_source_value("java", within, {"type": "ArrayList", "items": {"type": "String"}})[0]
    hostile = "new HashMap<" * (256 * 1024 // 12)  # 30 s for BFCL's patterns
    assert read_source_value("java", hostile, {"type": "HashMap"}) == (False, hostile)
    result = _score({"ttl": "60L", "keys": f"new ArrayList<>(Arrays.asList({keys}, {keys}))"})
    assert result["tool_correctness"] < 1.0
    assert "Cache.put.keys: java source text too long or a number too large" in result["tool_correctness_info"]
    assert _score({"ttl": "6" * 5000 + "L", "keys": within})["tool_correctness"] < 1.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"language": "kotlin"}, "'language' must be one of ['python', 'java', 'javascript']"),
        ({"functions": []}, "ground_truth in java needs 'functions'"),
        ({"language": "javascript"}, "Cache.put.ttl: type 'long' is not a javascript type BFCL converts"),
    ],
)
def test_unreadable_source_language_truths_are_refused_by_name(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_ground_truth({**JAVA_TRUTH, **change})


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"type": "Set"}, "type 'Set' is not a java type BFCL converts (BFCL cannot convert it)"),
        ({"type": "ArrayList"}, "a java ArrayList needs 'items' with a type among"),
        ({"type": "Array", "items": {"type": "Object"}}, "a java Array needs 'items' with a type among"),
        ({"type": ["String", "long"]}, "type ['String', 'long'] is not a java type"),
    ],
)
def test_java_types_bfcl_cannot_convert_are_refused(node: dict[str, Any], message: str) -> None:
    function = JAVA_TRUTH["functions"][0]  # type: ignore[index]
    properties = {**function["parameters"]["properties"], "keys": node}
    truth = {
        **JAVA_TRUTH,
        "functions": [{**function, "parameters": {**function["parameters"], "properties": properties}}],
    }
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_ground_truth(truth)

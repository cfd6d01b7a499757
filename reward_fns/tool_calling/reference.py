"""The ground truth of a tool-calling sample, read into one internal form.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/tool_calling/reference.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reward_fns.tool_calling.parse import ToolCall, parse_response
from reward_fns.tool_calling.schema_types import validate_schema_types
from reward_fns.tool_calling.source_values import LANGUAGES, PYTHON, python_node, source_text
from reward_fns.tool_calling.values import OPTIONAL_MARKER, acceptable_instance, expected_types

_GROUND_TRUTH_KEYS = frozenset({"functions", "answers", "calls", "language"})


@dataclass(frozen=True)
class FunctionSchema:
    """A callable function as described to the model.

    Attributes:
        name: function name.
        properties: argument name → JSON-schema node.
        required: arguments the schema marks required.
        source_nodes: for a Java / JavaScript function, argument → the schema node with the
            language's type names (``properties`` then holds the canonical kinds the converted
            values must have); empty for Python.
    """

    name: str
    properties: Mapping[str, Mapping[str, Any]]
    required: frozenset[str]
    source_nodes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class ReferenceCall:
    """One expected call with every acceptable value per argument.

    Attributes:
        name: function name.
        acceptable_values: argument → tuple of acceptable values (``""`` = may be omitted).
        mandatory: arguments that must be present (no ``""`` marker, or required by the schema).
    """

    name: str
    acceptable_values: Mapping[str, tuple[Any, ...]]
    mandatory: frozenset[str]


@dataclass(frozen=True)
class ToolCallingReference:
    """Everything the verifier knows about one sample.

    Attributes:
        functions: the function schemas shown to the model (may be empty).
        calls: the expected calls (at least one); their order does not matter.
        language: ``python``, ``java`` or ``javascript`` (how argument values are written).
    """

    functions: tuple[FunctionSchema, ...]
    calls: tuple[ReferenceCall, ...]
    language: str = PYTHON

    def schema_for(self, name: str) -> FunctionSchema | None:
        """The schema of function ``name``, or None when no schema was given."""
        return next((function for function in self.functions if function.name == name), None)


def _plain_data(value: Any) -> Any:
    """Undo what parquet round trips do to nested data (numpy arrays), leaving JSON types."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {key: _plain_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_data(item) for item in value]
    return value


def _function_schema(doc: Any, index: int, language: str) -> FunctionSchema:
    """Read one BFCL / OpenAI function doc (Java / JavaScript type names for those languages)."""
    if isinstance(doc, Mapping) and doc.get("type") == "function" and isinstance(doc.get("function"), Mapping):
        doc = doc["function"]
    if not isinstance(doc, Mapping) or not isinstance(doc.get("name"), str):
        raise ValueError(f"ground_truth functions[{index}] must be an object with a string 'name'")
    name = doc["name"]
    parameters = doc.get("parameters") or {}
    if language == PYTHON:
        validate_schema_types(parameters, name)
    properties = parameters.get("properties") or {}
    required = parameters.get("required") or []
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        raise ValueError(f"function {name!r}: 'properties' must be an object and 'required' a list")
    if language == PYTHON:
        return FunctionSchema(name=name, properties=dict(properties), required=frozenset(required))
    for argument, node in properties.items():
        if not isinstance(node, Mapping):
            raise ValueError(f"schema of {name}.{argument} must be an object, got {type(node).__name__}")
    return FunctionSchema(
        name=name,
        properties={
            argument: python_node(language, node, f"{name}.{argument}") for argument, node in properties.items()
        },
        required=frozenset(required),
        source_nodes=dict(properties),
    )


def _acceptable_values_from_answer(answer: Any, index: int) -> tuple[str, dict[str, tuple[Any, ...]]]:
    """Read one BFCL possible-answer entry ``{function: {argument: [acceptable values]}}``."""
    if not isinstance(answer, Mapping) or len(answer) != 1:
        raise ValueError(f"ground_truth answers[{index}] must be an object with exactly one function name")
    ((name, arguments),) = answer.items()
    if not isinstance(arguments, Mapping):
        raise ValueError(f"ground_truth answers[{index}] ({name}): arguments must be an object")
    acceptable: dict[str, tuple[Any, ...]] = {}
    for argument, alternatives in arguments.items():
        if not isinstance(alternatives, list) or not alternatives:
            raise ValueError(f"{name}.{argument}: acceptable values must be a non-empty list, got {alternatives!r}")
        acceptable[argument] = tuple(alternatives)
    return name, acceptable


def _exact_value_as_pattern(value: Any, schema: Mapping[str, Any] | None) -> Any:
    """An exact value in BFCL's acceptable-value form: patterns where the argument's type reads them."""
    expected = expected_types(schema)[0]
    outer = expected.outer if expected.outer is not None else type(value)
    if outer is dict and isinstance(value, Mapping):
        return {key: [item] for key, item in value.items()}
    if outer is list and expected.item is dict and isinstance(value, list):
        return [{key: [item] for key, item in v.items()} if isinstance(v, Mapping) else v for v in value]
    return value


def _acceptable_values_from_exact_call(call: Any, index: int) -> tuple[str, dict[str, tuple[Any, ...]]]:
    """Read one exact reference call ``{"name": ..., "arguments"|"parameters": {...}}``."""
    if isinstance(call, ToolCall):
        name, arguments = call.name, call.arguments
    elif isinstance(call, Mapping) and isinstance(call.get("name"), str):
        name = call["name"]
        arguments = call.get("arguments", call.get("parameters", {}))
    else:
        raise ValueError(f"ground_truth calls[{index}] must be an object with a string 'name'")
    if not isinstance(arguments, Mapping):
        raise ValueError(f"ground_truth calls[{index}] ({name}): arguments must be an object")
    return name, {argument: (value,) for argument, value in arguments.items()}


def _decode(ground_truth: Any) -> Any:
    """JSON-decode a string ground truth; a string of ``<tool_call>`` blocks is read as exact calls."""
    if not isinstance(ground_truth, str):
        return _plain_data(ground_truth)
    try:
        return json.loads(ground_truth)
    except ValueError:
        parsed = parse_response(ground_truth)
        if not parsed.well_formed:
            raise ValueError(f"ground_truth string is neither JSON nor tool calls: {parsed.error}") from None
        return list(parsed.calls)


def _check_dict_patterns(name: str, acceptable: Mapping[str, tuple[Any, ...]], schema: FunctionSchema | None) -> None:
    """A dict pattern of a dict argument maps every key to a list of alternatives (else nothing matches it)."""
    for argument, alternatives in acceptable.items():
        expected = expected_types(schema.properties.get(argument) if schema else None)[0]
        if expected.outer is not dict:
            continue
        for pattern in alternatives:
            bad = (
                [key for key, items in pattern.items() if not isinstance(items, list)]
                if isinstance(pattern, Mapping)
                else []
            )
            if bad:
                raise ValueError(f"{name}.{argument}: dict pattern keys {bad} must map to lists of acceptable values")


def _check_text_item_lists(name: str, acceptable: Mapping[str, tuple[Any, ...]], schema: FunctionSchema | None) -> None:
    """A Java / JS list whose items are read as text cannot equal an acceptable list with other items."""
    for argument, alternatives in acceptable.items():
        node = schema.properties.get(argument) if schema and schema.source_nodes else None
        if not node or node.get("type") != "array" or node["items"]["type"] != "string":
            continue
        lists = [a for a in alternatives if type(a) is list]
        if lists and all(any(type(item) is not str for item in a) for a in lists):
            raise ValueError(
                f"{name}.{argument}: its items are read as text, so no value equals the acceptable list(s) "
                f"{lists} (they hold non-text items)"
            )


def _reference_call(
    name: str, acceptable: dict[str, tuple[Any, ...]], schema: FunctionSchema | None, exact: bool
) -> ReferenceCall:
    """Combine acceptable values with the schema's required list into the mandatory set."""
    if exact:
        properties = schema.properties if schema else {}
        acceptable = {
            argument: tuple(_exact_value_as_pattern(value, properties.get(argument)) for value in values)
            for argument, values in acceptable.items()
        }
    _check_dict_patterns(name, acceptable, schema)
    _check_text_item_lists(name, acceptable, schema)
    mandatory = {argument for argument, values in acceptable.items() if OPTIONAL_MARKER not in values}
    if schema is not None:
        unanswerable = schema.required - acceptable.keys()
        if unanswerable:
            raise ValueError(f"reference call {name!r} lacks required argument(s) {sorted(unanswerable)}")
        mandatory |= schema.required
    return ReferenceCall(name=name, acceptable_values=acceptable, mandatory=frozenset(mandatory))


GROUND_TRUTH_CACHE_SIZE = 4096


def parse_ground_truth(ground_truth: Any) -> ToolCallingReference:
    """Read a ground truth in any accepted form (see the module docstring); JSON text is read once, then cached.

    Args:
        ground_truth: dict, list, JSON string or ``<tool_call>`` string.

    Returns:
        The normalised reference.

    Raises:
        ValueError: the ground truth is malformed; the message names the problem.
    """
    if isinstance(ground_truth, str):
        # verl passes the same JSON text for every response of a group (and the reader and the
        # scorer both read it): one parse each. The reference is never mutated, so sharing is safe.
        return _parse_ground_truth_text(ground_truth)
    return _parse_ground_truth_data(ground_truth)


@functools.lru_cache(maxsize=GROUND_TRUTH_CACHE_SIZE)
def _parse_ground_truth_text(ground_truth: str) -> ToolCallingReference:
    return _parse_ground_truth_data(ground_truth)


def _parse_ground_truth_data(ground_truth: Any) -> ToolCallingReference:
    data = _decode(ground_truth)
    if isinstance(data, list):
        data = {"calls": data}
    if not isinstance(data, Mapping):
        raise ValueError(f"ground_truth must be an object or a list of calls, got {type(data).__name__}")
    unknown_keys = data.keys() - _GROUND_TRUTH_KEYS
    if unknown_keys or ("answers" in data) == ("calls" in data):
        raise ValueError(
            f"ground_truth needs exactly one of 'answers' (BFCL possible answers) or 'calls' (exact calls), "
            f"plus optional 'functions'; got keys {sorted(data.keys())}"
        )
    functions_raw = data.get("functions") or []
    if not isinstance(functions_raw, list):
        raise ValueError("ground_truth 'functions' must be a list")
    language = data.get("language", PYTHON)
    if language not in LANGUAGES:
        raise ValueError(f"ground_truth 'language' must be one of {list(LANGUAGES)}, got {language!r}")
    if language != PYTHON and not functions_raw:
        raise ValueError(f"ground_truth in {language} needs 'functions' (their types say how to read the values)")
    functions = tuple(_function_schema(doc, index, language) for index, doc in enumerate(functions_raw))
    entries = data.get("answers", data.get("calls"))
    if not isinstance(entries, list) or not entries:
        raise ValueError("ground_truth must hold at least one expected call")
    read_entry = _acceptable_values_from_answer if "answers" in data else _acceptable_values_from_exact_call
    reference = ToolCallingReference(functions=functions, calls=(), language=language)
    calls = []
    for index, entry in enumerate(entries):
        name, acceptable = read_entry(entry, index)
        schema = reference.schema_for(name)
        if functions and schema is None:
            raise ValueError(f"reference call {name!r} is not among the functions {[f.name for f in functions]}")
        calls.append(_reference_call(name, acceptable, schema, exact="calls" in data))
    return ToolCallingReference(functions=functions, calls=tuple(calls), language=language)


def answer_value(
    alternatives: tuple[Any, ...], argument: str, schema: FunctionSchema | None, language: str = PYTHON
) -> Any:
    """A value a model could give that the rules accept: the first acceptable one, as source text in Java / JS.

    Args:
        alternatives: the argument's acceptable values (at least one is not ``""``).
        argument: the argument's name.
        schema: the function's schema (None when unknown).
        language: the reference's language.

    Returns:
        The value (a string of source text for Java / JavaScript).
    """
    value = acceptable_instance(alternatives, schema.properties.get(argument) if schema else None)
    if language == PYTHON or schema is None or argument not in schema.source_nodes:
        return value
    return source_text(language, value, schema.source_nodes[argument])


def _gold_arguments(call: ReferenceCall, schema: FunctionSchema | None, language: str) -> dict[str, Any]:
    """Mandatory arguments with their first concrete acceptable value."""
    arguments = {}
    for argument, values in call.acceptable_values.items():
        # BFCL sometimes lists "" first even for an argument its schema requires.
        if argument in call.mandatory and any(value != OPTIONAL_MARKER for value in values):
            arguments[argument] = answer_value(values, argument, schema, language)
    return arguments


def gold_calls(reference: ToolCallingReference) -> list[ToolCall]:
    """One correct answer: the first acceptable (non-``""``) value of each argument, optional ones omitted.

    For Java / JavaScript each value is written as source text (``source_values.source_text``).

    Args:
        reference: the normalised reference.

    Returns:
        One call per reference call, in reference order.
    """
    return [
        ToolCall(name=call.name, arguments=_gold_arguments(call, reference.schema_for(call.name), reference.language))
        for call in reference.calls
    ]

"""Whether one argument value is acceptable: BFCL's AST-checker rules, re-stated and re-implemented.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/tool_calling/values.py``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reward_fns.tool_calling.schema_types import canonical_kind

OPTIONAL_MARKER = ""
_IGNORED_STRING_CHARACTERS = re.compile(r"[ ,./\-_*^]")
_PYTHON_TYPE_BY_KIND: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "dict": dict,
    "null": type(None),
    "any": str,  # BFCL maps "any" to str; the possible answer's type is accepted too (rule 2).
}


def normalize_string(text: str) -> str:
    """Lower-case text without spaces or ``, . / - _ * ^``, single quotes as double (BFCL's standardisation).

    Args:
        text: a string value.

    Returns:
        The normalised text.
    """
    return _IGNORED_STRING_CHARACTERS.sub("", text).lower().replace("'", '"')


@dataclass(frozen=True)
class ExpectedType:
    """The Python types a schema node asks for.

    Attributes:
        outer: the value's type, or None to use the possible answer's type.
        item: the item type of an array (None when not an array or not declared).
    """

    outer: type | None
    item: type | None


def _python_type(type_name: Any) -> type | None:
    if not isinstance(type_name, str) or not type_name.strip():
        return None
    return _PYTHON_TYPE_BY_KIND[canonical_kind(type_name)]


def expected_types(schema: Mapping[str, Any] | None) -> list[ExpectedType]:
    """The types a schema node accepts; several for a union (``"type": [..]``), ``[untyped]`` without one.

    Args:
        schema: the argument's schema node (None or ``{}`` when unknown).

    Returns:
        One ``ExpectedType`` per member of the type union.
    """
    declared = (schema or {}).get("type")
    names = declared if isinstance(declared, list) else [declared]
    items = (schema or {}).get("items")
    item_type = _python_type(items.get("type")) if isinstance(items, Mapping) else None
    result = []
    for name in names:
        outer = _python_type(name)
        result.append(ExpectedType(outer=outer, item=item_type if outer is list else None))
    return result


def possible_answer_type(alternatives: Sequence[Any]) -> type | None:
    """The type of the first acceptable value that is not the optional marker ``""``."""
    for alternative in alternatives:
        if not (isinstance(alternative, str) and alternative == OPTIONAL_MARKER):
            return type(alternative)
    return None


def _item_type_ok(item: Any, acceptable_items: Any, item_type: type) -> bool:
    if type(item) is item_type:
        return True
    answer_type = possible_answer_type(acceptable_items) if isinstance(acceptable_items, list) else None
    return answer_type is not None and type(item) is answer_type


def _type_ok(value: Any, alternatives: Sequence[Any], expected: ExpectedType) -> tuple[bool, bool]:
    """Rule 2: (type acceptable, value is a "variable") for a value and its resolved expected type."""
    answer_type = possible_answer_type(alternatives)
    outer = expected.outer if expected.outer is not None else answer_type
    is_variable = answer_type is not None and answer_type is not outer
    if outer is not None and type(value) is outer:
        if expected.item is None:
            return True, is_variable
        for alternative in alternatives:
            if type(alternative) is not list:
                return True, is_variable  # BFCL: a non-list acceptable value skips the item check
            if all(_item_type_ok(item, alternative, expected.item) for item in value):
                return True, is_variable
        return False, False
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, False


def _normalized(value: Any) -> Any:
    return normalize_string(value) if type(value) is str else value


def _contains(alternatives: Sequence[Any], value: Any) -> bool:
    """Python's ``value in alternatives`` (``==``), safe against values that refuse comparison."""
    try:
        return any(value is alternative or bool(value == alternative) for alternative in alternatives)
    except Exception:
        return False


def _string_ok(value: str, alternatives: Sequence[Any]) -> bool:
    return normalize_string(value) in {normalize_string(a) for a in alternatives if type(a) is str}


def _list_ok(value: list[Any], alternatives: Sequence[Any]) -> bool:
    normalized = [_normalized(item) for item in value]
    # BFCL iterates each acceptable value by index: "" gives [] (so [] matches an optional list).
    candidates = [[_normalized(item) for item in a] for a in alternatives if type(a) in (list, str)]
    return _contains(candidates, normalized)


def dict_matches_pattern(value: Any, pattern: Any) -> bool:
    """A dict against one dict pattern ``{key: [acceptable values]}`` (module docstring, rule 3)."""
    if type(value) is not dict or not isinstance(pattern, Mapping):
        return False
    for key, item in value.items():
        alternatives = pattern.get(key) if isinstance(key, str) else None
        if not isinstance(alternatives, list) or not _contains(
            [_normalized(a) for a in alternatives], _normalized(item)
        ):
            return False
    return all(
        isinstance(alternatives, list) and _contains(alternatives, OPTIONAL_MARKER)
        for key, alternatives in pattern.items()
        if key not in value
    )


def _dict_ok(value: dict[str, Any], alternatives: Sequence[Any]) -> bool:
    return any(dict_matches_pattern(value, a) for a in alternatives if not (type(a) is str and a == OPTIONAL_MARKER))


def _list_of_dicts_ok(value: list[Any], alternatives: Sequence[Any]) -> bool:
    for alternative in alternatives:
        if type(alternative) not in (list, str) or len(alternative) != len(value):
            continue
        if all(_dict_ok(item, [pattern]) for item, pattern in zip(value, alternative, strict=True)):
            return True
    return False


def _value_ok(value: Any, alternatives: Sequence[Any], expected: ExpectedType, is_variable: bool) -> bool:
    outer = expected.outer if expected.outer is not None else possible_answer_type(alternatives)
    if not is_variable:
        if outer is dict:
            return _dict_ok(value, alternatives)
        if outer is list and expected.item is dict:
            return _list_of_dicts_ok(value, alternatives)
        if outer is str:
            return _string_ok(value, alternatives)
        if outer is list:
            return _list_ok(value, alternatives)
    return _contains(alternatives, value)


def value_problem(value: Any, alternatives: Sequence[Any], schema: Mapping[str, Any] | None) -> str | None:
    """Check one argument value under the rules of the module docstring.

    Args:
        value: the model's value (JSON data).
        alternatives: the acceptable values (``""`` = the argument may be left out).
        schema: the argument's schema node (``{}`` or None when unknown).

    Returns:
        None when acceptable, else ``"wrong type"`` or ``"wrong value"``.
    """
    problem = "wrong type"
    for expected in expected_types(schema):
        candidate = float(value) if expected.outer is float and type(value) is int else value
        type_ok, is_variable = _type_ok(candidate, alternatives, expected)
        if not type_ok:
            continue
        if _value_ok(candidate, alternatives, expected, is_variable):
            return None
        problem = "wrong value"
    return problem


def _pattern_instance(pattern: Any) -> Any:
    """One dict a dict pattern accepts: each key's first acceptable value, optional keys left out."""
    if not isinstance(pattern, Mapping):
        return pattern
    return {
        key: alternatives[0]
        for key, alternatives in pattern.items()
        if isinstance(alternatives, list) and alternatives and OPTIONAL_MARKER not in alternatives
    }


def acceptable_instance(alternatives: Sequence[Any], schema: Mapping[str, Any] | None) -> Any:
    """A concrete value that ``value_problem`` accepts: the first acceptable one, patterns filled in.

    Args:
        alternatives: the acceptable values; at least one is not ``""``.
        schema: the argument's schema node.

    Returns:
        The value (a dict pattern becomes a dict, a list of dict patterns a list of dicts).
    """
    concrete = next(a for a in alternatives if not (type(a) is str and a == OPTIONAL_MARKER))
    expected = expected_types(schema)[0]
    outer = expected.outer if expected.outer is not None else type(concrete)
    if outer is not type(concrete):
        return concrete  # a "variable": compared as it is
    if outer is dict:
        return _pattern_instance(concrete)
    if outer is list and expected.item is dict:
        return [_pattern_instance(item) for item in concrete]
    return concrete

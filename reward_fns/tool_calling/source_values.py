"""Argument values written as Java or JavaScript source: BFCL's reading of them, re-stated.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/tool_calling/source_values.py``).
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

PYTHON, JAVA, JAVASCRIPT = "python", "java", "javascript"
LANGUAGES = (PYTHON, JAVA, JAVASCRIPT)

# Source type name → the canonical kind (``schema_types``) its converted value must have.
JAVA_KINDS: dict[str, str] = {
    **dict.fromkeys(("byte", "short", "integer", "long"), "integer"),
    **dict.fromkeys(("float", "double"), "float"),
    "boolean": "boolean",
    **dict.fromkeys(("char", "String", "any"), "string"),
    **dict.fromkeys(("Array", "ArrayList"), "array"),
    "HashMap": "dict",
}
JAVASCRIPT_KINDS: dict[str, str] = {
    "String": "string",
    "any": "string",
    "integer": "integer",
    "Bigint": "integer",
    "float": "float",
    "Boolean": "boolean",
    "dict": "dict",
    "array": "array",
}
KINDS_BY_LANGUAGE = {JAVA: JAVA_KINDS, JAVASCRIPT: JAVASCRIPT_KINDS}
_UNCONVERTIBLE_JAVA = frozenset({"Set", "Hashtable", "Queue", "Stack"})
# Longest collection text read (module docstring): bounds the time spent on one value.
MAX_COLLECTION_CHARS = 4096

_DIGITS = re.compile(r"-?\d+$")
_JAVA_LONG = re.compile(r"-?\d+[lL]$")
_JAVA_FLOAT = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$")
_JAVA_DOUBLE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?$")
_JS_FLOAT = re.compile(r"-?\d+(\.\d+)?$")
_JS_BIGINT = re.compile(r"-?\d+n$")
_JAVA_ARRAY = re.compile(r"new\s+\w+\[\]\s*\{(.*?)\}")
_JAVA_AS_LIST = re.compile(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)")
_JAVA_ADDS = re.compile(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", re.DOTALL)
_JAVA_ADD = re.compile(r"add\((.+?)\)")
_JAVA_EMPTY_LIST = re.compile(r"new\s+ArrayList<\w*>\(\)")
_JAVA_PUTS = re.compile(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", re.DOTALL)
_JAVA_PUT = re.compile(r"put\(\"(.*?)\",\s*(.*?)\)")
_JAVA_EMPTY_MAP = re.compile(r"new\s+HashMap<.*?>\s*\(\)")
_JS_NESTED_ARRAY = re.compile(r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)")
_JS_BRACKETS = re.compile(r"\[(.*?)\]")
_JS_ARRAY = re.compile(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)")
_JS_OBJECT = re.compile(r"\{(.*?)\}")
_JS_PAIR = re.compile(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)")


def _number_or_text(text: str) -> Any:
    """Python's ``int()``, else ``float()``, else the text."""
    for reader in (int, float):
        try:
            return reader(text)
        except ValueError:
            pass
    return text


def _quoted(text: str, quotes: str) -> bool:
    return any(text.startswith(q) and text.endswith(q) for q in quotes)


def _java_untyped(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if _quoted(text, '"'):
        return text[1:-1]
    if _JAVA_LONG.match(text):
        return int(text[:-1])
    if _JAVA_FLOAT.match(text):
        return float(_drop_suffix(text))
    return _number_or_text(text)


def _drop_suffix(text: str) -> str:
    """The text without its type letter (the last letter before the end or a final newline, as ``$`` matches)."""
    return re.sub(r"[a-zA-Z]$", "", text)


def _when(pattern: re.Pattern[str], text: str, convert: Callable[[str], Any]) -> Any:
    return convert(text) if pattern.match(text) else text


def _java_list_item(text: str, item_type: str) -> Any:
    return text.strip()[1:-1] if item_type in ("char", "String") else java_value(text.strip(), item_type)


def _java_array_list(text: str, item_type: str) -> Any:
    as_list = _JAVA_AS_LIST.search(text)
    if as_list:
        return [_java_list_item(piece, item_type) for piece in as_list.group(1).split(",")]
    adds = _JAVA_ADDS.search(text)
    if adds:
        return [_java_list_item(piece, item_type) for piece in _JAVA_ADD.findall(adds.group(1))]
    return [] if _JAVA_EMPTY_LIST.search(text) else text


def _java_hash_map(text: str) -> Any:
    puts = _JAVA_PUTS.search(text)
    if puts:
        return {key: _java_untyped(value.strip()) for key, value in _JAVA_PUT.findall(puts.group(1))}
    return {} if _JAVA_EMPTY_MAP.search(text) else text


def java_value(text: str, type_name: str, item_type: str | None = None) -> Any:
    """Read Java source text as BFCL does (module docstring).

    Args:
        text: the model's argument value.
        type_name: the parameter's Java type (a key of ``JAVA_KINDS``).
        item_type: the item type of an ``Array`` / ``ArrayList``.

    Returns:
        The Python value, or the text itself when it lacks the type's form.
    """
    kind = JAVA_KINDS[type_name]
    if type_name == "long":
        return _when(_JAVA_LONG, text, lambda t: int(_drop_suffix(t)))
    if kind == "integer":
        return _when(_DIGITS, text, int)
    if type_name == "float":
        return _when(_JAVA_FLOAT, text, lambda t: float(_drop_suffix(t)))
    if type_name == "double":
        return _when(_JAVA_DOUBLE, text, float)
    if kind == "boolean":
        return text == "true" if text in ("true", "false") else text
    if type_name == "Array":
        array = _JAVA_ARRAY.search(text)
        if not array:
            return text
        return [java_value(piece.strip(), item_type or "any") for piece in array.group(1).split(",") if piece.strip()]
    if type_name == "ArrayList":
        return _java_array_list(text, item_type or "any")
    if type_name == "HashMap":
        return _java_hash_map(text)
    return text  # char, String, any


def _js_untyped(text: str) -> Any:
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if _quoted(text, "\"'"):
        return text[1:-1]
    return _number_or_text(text)


def _js_array(text: str, item_type: str | None) -> Any:
    nested = _JS_NESTED_ARRAY.match(text)
    if nested:
        rows = []
        for index, body in enumerate(_JS_BRACKETS.findall(nested.group(0))):
            body = body.strip()
            body = body[1:] if index == 0 and body.startswith("[") else body
            rows.append([_js_untyped(piece.strip()) for piece in body.split(",")])
        return rows
    array = _JS_ARRAY.match(text)
    if not array:
        return text
    body = next((group for group in array.groups() if group is not None), "").strip()
    pieces = [piece.strip() for piece in body.split(",")] if body else []
    if item_type is None:
        return [_js_untyped(piece) for piece in pieces]
    return [javascript_value(piece, item_type, "String" if _quoted(piece[:1], "\"'") else None) for piece in pieces]


def _js_object(text: str) -> Any:
    if text == "{}":
        return {}
    match = _JS_OBJECT.match(text)
    if not match:
        return text
    result: dict[str, Any] = {}
    for key, value in _JS_PAIR.findall(match.group(1)):
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            result[key.strip().strip("'\"")] = _js_array(value, None)
        elif value.startswith("{") and value.endswith("}"):
            result[key.strip().strip("'\"")] = _js_object(value)
        else:
            result[key.strip().strip("'\"")] = _js_untyped(value.strip("'\""))
    return result


def javascript_value(text: str, type_name: str, item_type: str | None = None) -> Any:
    """Read JavaScript source text as BFCL does (module docstring).

    Args:
        text: the model's argument value.
        type_name: the parameter's JavaScript type (a key of ``JAVASCRIPT_KINDS``).
        item_type: the item type of an ``array``.

    Returns:
        The Python value, or the text itself when it lacks the type's form.
    """
    if type_name == "String":
        return text[1:-1] if _quoted(text, "\"'") else text
    if type_name == "integer":
        return _when(_DIGITS, text, int)
    if type_name == "float":
        return _when(_JS_FLOAT, text, float)
    if type_name == "Bigint":
        return _when(_JS_BIGINT, text, lambda t: int(t[:-1]))
    if type_name == "Boolean":
        return text == "true" if text in ("true", "false") else text
    try:  # BFCL returns the stripped text whenever reading a collection fails
        if type_name == "array":
            return _js_array(text.strip(), item_type)
        if type_name == "dict":
            return _js_object(text.strip())
    except (ValueError, KeyError, IndexError):
        return text.strip()
    return text  # any


def _node_types(node: Mapping[str, Any]) -> tuple[str, str | None]:
    items = node.get("items")
    item_type = items.get("type") if isinstance(items, Mapping) else None
    return node.get("type"), item_type  # type: ignore[return-value]


def read_source_value(language: str, value: Any, node: Mapping[str, Any]) -> tuple[bool, Any]:
    """Convert a model's argument value written in ``language`` source.

    Args:
        language: ``java`` or ``javascript``.
        value: the model's value (must be a string).
        node: the parameter's schema node with the language's type names.

    Returns:
        ``(False, value)`` when the value is not a string (BFCL: the wrong type), is a collection
        over ``MAX_COLLECTION_CHARS`` long, or its number cannot be read (Python refuses ints of
        over 4300 digits; BFCL's checker fails on them), else ``(True, converted value)``.
    """
    if type(value) is not str:
        return False, value
    type_name, item_type = _node_types(node)
    if len(value) > MAX_COLLECTION_CHARS and KINDS_BY_LANGUAGE[language][type_name] in ("array", "dict"):
        return False, value
    read = java_value if language == JAVA else javascript_value
    try:
        return True, read(value, type_name, item_type)
    except ValueError:
        return False, value


def python_node(language: str, node: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The canonical-kind schema node a converted value is checked against; refuses what BFCL cannot read.

    Args:
        language: ``java`` or ``javascript``.
        node: the parameter's schema node with the language's type names.
        where: ``function.argument`` for the error message.

    Returns:
        ``{"type": kind}`` plus ``{"items": {"type": kind}}`` for arrays.

    Raises:
        ValueError: the type (or an array's item type) is not one BFCL converts for the language.
    """
    kinds = KINDS_BY_LANGUAGE[language]
    type_name, item_type = _node_types(node)
    if not isinstance(type_name, str) or type_name not in kinds:
        unconvertible = language == JAVA and isinstance(type_name, str) and type_name in _UNCONVERTIBLE_JAVA
        why = " (BFCL cannot convert it)" if unconvertible else ""
        raise ValueError(
            f"{where}: type {type_name!r} is not a {language} type BFCL converts{why}; known: {sorted(kinds)}"
        )
    result: dict[str, Any] = {"type": kinds[type_name]}
    if kinds[type_name] == "array":
        if not isinstance(item_type, str) or item_type not in kinds:
            raise ValueError(f"{where}: a {language} {type_name} needs 'items' with a type among {sorted(kinds)}")
        result["items"] = {"type": kinds[item_type]}
    return result


def _plain_number(number: float) -> str:
    """A float as digits without an exponent, read back by ``float()`` as the same float."""
    return format(decimal.Decimal(repr(float(number))), "f")


def _java_literal(value: Any) -> str:
    """A HashMap value that BFCL reads back (untyped) as ``value``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value) if isinstance(value, float) else str(value)


def java_source(value: Any, type_name: str, item_type: str | None = None) -> str:
    """Java source text that ``java_value`` reads back as ``value`` (for gold answers).

    Args:
        value: the Python value (an acceptable value of the possible answer).
        type_name: the parameter's Java type.
        item_type: the item type of an ``Array`` / ``ArrayList``.

    Returns:
        The text; a string value is written as it is (a "variable" or a ``String``).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if type_name == "long":
        return f"{value}L"
    if type_name == "float":
        return f"{float(value)!r}f"
    if isinstance(value, list) and type_name == "Array":
        return "new Object[]{" + ", ".join(java_source(item, item_type or "any") for item in value) + "}"
    if isinstance(value, list):
        quote = {"char": "'", "String": '"'}.get(item_type or "", "")
        items = [f"{quote}{item}{quote}" if quote else java_source(item, item_type or "any") for item in value]
        return "new ArrayList<>(Arrays.asList(" + ", ".join(items) + "))" if items else "new ArrayList<>()"
    if isinstance(value, Mapping):
        puts = " ".join(f'put("{key}", {_java_literal(item)});' for key, item in value.items())
        return "new HashMap<String, Object>() {{ " + puts + " }}"
    return str(value)


def _js_literal(value: Any, type_name: str | None = None) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float) or type_name == "float":
        return _plain_number(value)
    if isinstance(value, list):
        return "[" + ", ".join(_js_literal(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(key))}: {_js_literal(item)}" for key, item in value.items()) + "}"
    return str(value)


def javascript_source(value: Any, type_name: str, item_type: str | None = None) -> str:
    """JavaScript source text that ``javascript_value`` reads back as ``value`` (for gold answers).

    Args:
        value: the Python value.
        type_name: the parameter's JavaScript type.
        item_type: the item type of an ``array``.

    Returns:
        The text (a ``String`` double-quoted, ``any`` or a variable as it is).
    """
    if type_name == "String" and isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, str):
        return value
    if type_name == "Bigint" and not isinstance(value, bool):
        return f"{value}n"
    if isinstance(value, list):
        return "[" + ", ".join(_js_literal(item, item_type) for item in value) + "]"
    return _js_literal(value, type_name)


def source_text(language: str, value: Any, node: Mapping[str, Any]) -> str:
    """``value`` written as ``language`` source for the parameter ``node`` (see ``java_source``)."""
    type_name, item_type = _node_types(node)
    write = java_source if language == JAVA else javascript_source
    return write(value, type_name, item_type)

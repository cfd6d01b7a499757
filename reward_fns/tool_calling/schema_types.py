"""Type rules that a tool-call argument must obey, taken from the function's JSON schema.

BFCL writes its schemas with Python-flavoured type names (``dict``, ``float``,
``tuple``, ``any``); plain JSON Schema uses ``object`` and ``number``. Both map
onto one small set of canonical kinds here; ``values`` applies BFCL's type rule
to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Canonical kinds: string, integer, float, boolean, array, dict, null, any.
_KIND_BY_TYPE_NAME: dict[str, str] = {
    "string": "string",
    "str": "string",
    "char": "string",
    "integer": "integer",
    "int": "integer",
    "long": "integer",
    "float": "float",
    "number": "float",
    "double": "float",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "arraylist": "array",
    "list": "array",
    # A tuple arrives as a JSON list (or is converted to one by the parser).
    "tuple": "array",
    "dict": "dict",
    "object": "dict",
    "hashmap": "dict",
    "null": "null",
    "any": "any",
    "": "any",
}


def canonical_kind(type_name: str) -> str:
    """Map a schema type name onto a canonical kind.

    Args:
        type_name: the ``type`` of a JSON-schema node, any capitalisation
            (Java-style names such as ``String`` or ``HashMap`` included).

    Returns:
        One of ``string, integer, float, boolean, array, dict, null, any``.

    Raises:
        ValueError: the type name is unknown.
    """
    kind = _KIND_BY_TYPE_NAME.get(type_name.strip().lower())
    if kind is None:
        raise ValueError(f"unknown JSON-schema type {type_name!r}; known: {sorted(set(_KIND_BY_TYPE_NAME))}")
    return kind


def _type_names(schema: Mapping[str, Any]) -> list[str]:
    """The type names of a schema node; a missing type means ``any``, a list means a union."""
    declared = schema.get("type", "any")
    names = declared if isinstance(declared, list) else [declared]
    if not all(isinstance(name, str) for name in names):
        raise ValueError(f"schema 'type' must be a string or a list of strings, got {declared!r}")
    return names


def validate_schema_types(schema: Mapping[str, Any], where: str) -> None:
    """Check, recursively, that every type name in a parameter schema is known.

    Called once when the ground truth is read, so a bad schema fails loudly
    there instead of silently scoring every response 0.

    Args:
        schema: a JSON-schema node (``properties`` and ``items`` are followed).
        where: a path for the error message, e.g. ``"get_weather.city"``.

    Raises:
        ValueError: a type name is unknown or a node is not a mapping.
    """
    if not isinstance(schema, Mapping):
        raise ValueError(f"schema of {where} must be an object, got {type(schema).__name__}")
    for name in _type_names(schema):
        try:
            canonical_kind(name)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
    for property_name, property_schema in (schema.get("properties") or {}).items():
        validate_schema_types(property_schema, f"{where}.{property_name}")
    if isinstance(schema.get("items"), Mapping):
        validate_schema_types(schema["items"], f"{where}[]")

"""omegaconf detail: a config node as written (an interpolation stays one) rather than its resolved value."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig

__all__ = ["WrittenValue", "written_value"]


class WrittenValue:
    """A scalar of a config as written: an interpolation (``${...}``), null, or a plain value.

    Relies on: omegaconf 2.3's ``Node._is_interpolation``, ``_is_none`` and ``_value``.
    """

    def __init__(self, node: Any) -> None:
        self.is_interpolation = bool(node._is_interpolation())
        self.is_none = not self.is_interpolation and bool(node._is_none())
        self.value = None if self.is_interpolation or self.is_none else node._value()


def written_value(parent: DictConfig, key: Any) -> Any:
    """``parent[key]`` as written: a :class:`WrittenValue` for a scalar, the child config for a mapping or list.

    Relies on: omegaconf 2.3's ``DictConfig._get_node`` (the node, without resolving interpolations).
    """
    node = parent._get_node(key)
    if isinstance(node, (DictConfig, ListConfig)):
        return node
    return WrittenValue(node)

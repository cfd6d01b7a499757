"""Reading non-tensor fields (reward components, verifier information) back from TransferQueue."""

from __future__ import annotations

from typing import Any

import numpy as np


def _items(values: Any) -> list[Any]:
    """Plain Python items of a TransferQueue non-tensor field (NonTensorStack, LinkedList or ndarray).

    Iterating a NonTensorStack yields NonTensorData wrappers; ``tolist`` unwraps them (as verl does for uid).
    """
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [getattr(item, "data", item) if type(item).__name__ == "NonTensorData" else item for item in items]


def as_object_array(values: Any) -> np.ndarray:
    """A TransferQueue non-tensor field → 1-D object array."""
    items = _items(values)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def as_float_array(values: Any, key: str) -> np.ndarray:
    """A numeric non-tensor field → float64 array; a clear error for anything non-numeric."""
    items = _items(values)
    try:
        return np.asarray([float(v) for v in items], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"mrtpo: reward component {key!r} holds non-numeric values ({error})") from error

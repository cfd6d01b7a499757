"""Reading non-tensor fields (reward components, verifier information) back from TransferQueue."""

from __future__ import annotations

from typing import Any

import numpy as np


def as_object_array(values: Any) -> np.ndarray:
    """A TransferQueue non-tensor field (NonTensorStack, LinkedList or ndarray) → 1-D object array."""
    items = list(values)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def as_float_array(values: Any, key: str) -> np.ndarray:
    """A numeric non-tensor field → float64 array; a clear error for anything non-numeric."""
    items = list(values)
    try:
        return np.asarray([float(v) for v in items], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"mrtpo: reward component {key!r} holds non-numeric values ({error})") from error

"""Optional fused GPU path of :func:`mrtpo_verl.math.relevance.js_distance` (Triton).

The kernel lives in :mod:`mrtpo_verl.kernels.js_triton`, which imports Triton at module level;
this module only imports it on first use, so the math package imports (and type-checks) on
machines without Triton. ``js_distance(..., backend="auto")`` uses the kernel for CUDA tensors
when it imports and falls back to the torch path otherwise (with one warning if Triton is
installed but broken); ``backend="triton"`` makes a missing or broken Triton an error.
"""

from __future__ import annotations

import functools
import importlib
import logging
from types import ModuleType

import torch

__all__ = ["js_divergence_bits", "require_triton", "triton_available"]

KERNEL_MODULE = "mrtpo_verl.kernels.js_triton"
logger = logging.getLogger(__name__)


@functools.cache
def _load() -> tuple[ModuleType | None, BaseException | None]:
    """Import the kernel module once: (module, None) or (None, the import error)."""
    try:
        return importlib.import_module(KERNEL_MODULE), None
    except ImportError as error:  # Triton is not installed: the expected case on CPU machines.
        return None, error
    except Exception as error:  # Installed but broken (e.g. a driver/toolchain mismatch): say so once.
        logger.warning("Triton JS kernel unavailable, using the torch path: %r", error)
        return None, error


def triton_available() -> bool:
    """Whether the Triton kernel module imports on this machine."""
    return _load()[0] is not None


def require_triton() -> None:
    """Raise a clear error when the Triton kernel cannot be used.

    Raises:
        RuntimeError: Triton is missing or fails to import (the cause is chained).
    """
    _, error = _load()
    if error is not None:
        raise RuntimeError(
            f"js_distance(backend='triton') needs Triton, but {KERNEL_MODULE} does not import: {error!r}; "
            "use backend='auto' or 'torch' for the torch path"
        ) from error


def js_divergence_bits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Per-row JSD in bits from the fused kernel, NaN for a row that is not a distribution.

    Args:
        logits_p: (n_tokens, vocab) logits of P on one CUDA device, float32/bf16/fp16.
        logits_q: (n_tokens, vocab) logits of Q, same shape and device.

    Returns:
        (n_tokens,) float32 divergence (base 2), not yet clamped to [0, 1].
    """
    require_triton()
    module, _ = _load()
    assert module is not None
    result = module.js_divergence_bits(logits_p, logits_q)
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"{KERNEL_MODULE}.js_divergence_bits returned {type(result).__name__}, not a tensor")
    return result

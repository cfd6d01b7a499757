"""Run a model's forward pass in float32 whatever dtype its weights are stored or gathered in.

A bf16 forward pass rounds every matmul's inputs to 8 bits of mantissa, and two passes of the same context that
differ only in batching then differ by a Jensen–Shannon distance comparable to the leave-one-out signal itself.
Computing in float32 with the weights as they are (bf16 parameters upcast at each use) removes that noise: the
relevance then differs from a float32 model's only by the weights' own rounding, and not at all where the weights
are float32, as the colocated replay gathers verl's master shards (figures: ``docs/numerics.md``).

:func:`float32_compute` is a context in which

- autocast is off (an outer ``torch.autocast``, e.g. verl's engine forward, would cast back to bf16),
- a :class:`~torch.overrides.TorchFunctionMode` upcasts bf16/fp16 tensors given to the functions that
  combine activations with weights (``F.linear``, the norms, matmuls and ``einsum``,
  ``scaled_dot_product_attention``) and turns an embedding lookup's rows to float32; every other torch function
  (FSDP's all-gathers and casts included) runs untouched.

Each weight is upcast when it is used and dropped after, so the extra memory is one layer's largest weight in
float32; the LM head's weight, used once per chunk of response positions, is upcast once per context.

The context also sets torch's float32 matmul precision to ``"highest"`` for its block (restored after): IEEE
float32, whatever the run set globally (``"medium"`` would let float32 matmuls run in bf16, ``"high"`` in TF32, the
rotary embedding's position product included). ``compute_dtype: tf32`` and ``fp16`` reduce the precision of the
weight and attention products only: :mod:`~mrtpo_verl.replay.tf32_matmuls`, :mod:`~mrtpo_verl.replay.fp16_matmuls`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["LOW_PRECISION", "Float32Compute", "float32_compute", "matmul_precision"]

#: Floating dtypes this context computes in float32 instead.
LOW_PRECISION = (torch.bfloat16, torch.float16)

#: Functions whose low-precision tensor arguments are upcast before the call.
_UPCAST_ARGUMENTS: frozenset[Callable[..., Any]] = frozenset(
    {
        F.linear,
        F.layer_norm,
        F.group_norm,
        F.rms_norm,
        F.scaled_dot_product_attention,
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.baddbmm,
        torch.addbmm,
        torch.addmv,
        torch.mv,
        torch.dot,
        torch.outer,
        torch.tensordot,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
    }
)


def _upcast(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION:
        return value.float()
    return value


class Float32Compute(TorchFunctionMode):
    """Upcasts the inputs of weight-combining functions to float32 (see the module docstring).

    Args:
        keep_upcast: a weight (e.g. the LM head's) whose float32 copy is made once and reused for the
            context's lifetime; other weights are upcast at each use.
    """

    def __init__(self, keep_upcast: torch.Tensor | None = None) -> None:
        super().__init__()
        self._keep = keep_upcast
        self._kept: torch.Tensor | None = None

    def _kept_as(self, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """The kept weight's copy in ``dtype``, made at its first use; None for any other tensor."""
        if self._keep is None or value is not self._keep:
            return None
        if self._kept is None:
            self._kept = value.to(dtype)
        return self._kept

    def _argument(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION:
            kept = self._kept_as(value, torch.float32)
            return value.float() if kept is None else kept
        return value

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.einsum:  # einsum(equation, *operands) or einsum(equation, [operands])
            args = tuple(
                [self._argument(v) for v in value] if isinstance(value, (list, tuple)) else self._argument(value)
                for value in args
            )
            return func(*args, **kwargs)
        if func in _UPCAST_ARGUMENTS:
            args = tuple(self._argument(value) for value in args)
            kwargs = {name: self._argument(value) for name, value in kwargs.items()}
            return func(*args, **kwargs)
        if func is F.embedding:
            return _upcast(func(*args, **kwargs))
        return func(*args, **kwargs)


@contextmanager
def matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` for the block; the previous setting restored after."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@contextmanager
def float32_compute(device_type: str, keep_upcast: torch.Tensor | None = None, upcast: bool = True) -> Iterator[None]:
    """Autocast off on ``device_type``, :class:`Float32Compute` on and torch's float32 matmul precision ``"highest"``,
    for the block's forward passes.

    Args:
        device_type: ``"cuda"``, ``"cpu"``, ...: the device whose autocast is turned off.
        keep_upcast: see :class:`Float32Compute`.
        upcast: False for a model that already computes in float32 (float32 weights, no autocast): then only the
            matmul precision is set, without the mode's per-call dispatch.
    """
    with matmul_precision("highest"):
        if not upcast:
            yield
            return
        with torch.autocast(device_type=device_type, enabled=False), Float32Compute(keep_upcast):
            yield

"""Which products a reduced-precision replay mode (``replay.compute_dtype`` fp16 / tf32) may reduce: the rule.

The fp16 and TF32 modes (:mod:`~mrtpo_verl.replay.fp16_matmuls`, :mod:`~mrtpo_verl.replay.tf32_matmuls`) reduce the
precision of exactly two kinds of products, decided by what the operands are and where the product is issued:

- **weight products**: ``F.linear`` (projections, MLP, the LM head) and ``torch.addmm`` (GPT-2-style ``Conv1D``:
  ``bias + x @ weight``), whose weight operand is not a module buffer;
- **attention products**: ``F.scaled_dot_product_attention`` (q·kᵀ and p·v), and the two-operand matmuls
  (``torch.matmul``/``bmm``/``mm``, ``Tensor.matmul``, the ``@`` operator) issued inside an attention module's
  forward (a module whose class name contains ``"Attention"``, as transformers names them), i.e. eager attention's
  q·kᵀ and p·v.

Every other product stays IEEE float32 (operands upcast, torch's float32 matmul precision ``"highest"``):

- anything issued inside a rotary-embedding module's forward (a module whose class name contains ``"Rotary"`` or that
  holds an ``inv_freq`` buffer): transformers' ``inv_freq @ position_ids`` there forms the angles of every position,
  and an fp16 or TF32 input would drop the low bits of positions above 2,048 (fp16's 11-bit significand);
- any product one of whose operands is, or views, a module buffer (``inv_freq``, position tables, masks), wherever
  it is issued;
- any two-operand matmul outside an attention module, ``einsum``, ``baddbmm`` and the rest: position arithmetic,
  custom layers. Being float32 is never wrong, only slower.

The zones are entered and left with forward pre-hooks and forward hooks on the model's modules, registered while the
mode is on and removed after. Without a model (``model=None``) there are no zones: linear layers, ``addmm`` and
``scaled_dot_product_attention`` follow the rule, every bare matmul is float32.

Products the modes cannot see are refused, not run in another precision: transformers' mixture-of-experts layers run
their experts through ``grouped_mm`` (``torch._grouped_mm`` / ``F.grouped_mm``), which casts its input to the
weights' dtype. :func:`compute_dtype_refusal` says so from a model config (at start-up), and the modes raise the same
line at their first replay where the model's config shows experts, or at the first ``grouped_mm`` call otherwise.

:func:`emulated_products` makes the modes entered inside it emulate their reduced-precision products on any device
(CPU or CUDA) with IEEE float32 arithmetic: the CPU tests and benchmarks use it for TF32 (on a CPU, ``tf32`` is plain
IEEE float32 otherwise) and a GPU check can use it to compare CUDA's kernels with the emulation on the same inputs.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from mrtpo_verl.compute_dtypes import EXPERT_COUNT_FIELDS, REDUCED_COMPUTE_DTYPES, compute_dtype_refusal
from mrtpo_verl.replay.float32_compute import Float32Compute

__all__ = [
    "EXPERT_COUNT_FIELDS",
    "REDUCED_COMPUTE_DTYPES",
    "ModelZones",
    "RuledProducts",
    "compute_dtype_refusal",
    "emulated_products",
    "emulation_forced",
    "to_tf32",
]

_TWO_OPERANDS: frozenset[Callable[..., Any]] = frozenset(
    {torch.matmul, torch.bmm, torch.mm, torch.Tensor.matmul, torch.Tensor.__matmul__}
)
_GROUPED_MM: frozenset[Callable[..., Any]] = frozenset(
    f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f is not None
)

_FORCED: contextvars.ContextVar[bool] = contextvars.ContextVar("mrtpo_emulated_products", default=False)


@contextmanager
def emulated_products() -> Iterator[None]:
    """Within the block, every fp16 / TF32 mode entered emulates its reduced-precision products (IEEE float32 on the
    rounded inputs, :func:`~mrtpo_verl.replay.fp16_matmuls.emulated_fp16_kernels`, :func:`to_tf32`), on any device.
    Without it the modes run CUDA's kernels on CUDA, emulate fp16 elsewhere, and compute ``tf32`` as IEEE float32 on a
    CPU."""
    token = _FORCED.set(True)
    try:
        yield
    finally:
        _FORCED.reset(token)


def emulation_forced() -> bool:
    """True inside :func:`emulated_products`."""
    return _FORCED.get()


def to_tf32(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy of ``tensor`` rounded to TF32's 10 mantissa bits, to nearest with ties away from zero (the
    ``cvt.rna.tf32.f32`` conversion), as a tensor core reads a float32 matmul input in TF32 mode. Exponent range and
    special values are float32's."""
    bits = tensor.float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _refuse_grouped_mm(compute_dtype: str) -> RuntimeError:
    return RuntimeError(
        f"mrtpo.replay.compute_dtype={compute_dtype} cannot apply its precision rule to grouped_mm (the experts of a "
        "mixture-of-experts layer run in the weights' dtype); use mrtpo.replay.compute_dtype fp32 or model"
    )


def _is_rotary(module: torch.nn.Module) -> bool:
    return "Rotary" in type(module).__name__ or "inv_freq" in getattr(module, "_buffers", {})


def _is_attention(module: torch.nn.Module) -> bool:
    return "Attention" in type(module).__name__ and not _is_rotary(module)


class ModelZones:
    """The rule's view of one model: which forward is running (rotary / attention zones, counted by hooks) and which
    storages are its buffers. A context manager: hooks registered on ``__enter__``, removed on ``__exit__``.

    Args:
        model: a ``torch.nn.Module`` or None (no zones, no buffers).
    """

    def __init__(self, model: Any) -> None:
        self.model = model if isinstance(model, torch.nn.Module) else None
        self.rotary_depth = 0
        self.attention_depth = 0
        self._handles: list[Any] = []
        self._buffers: set[int] = set()

    def __enter__(self) -> ModelZones:
        if self.model is None:
            return self
        self._buffers = {
            buffer.untyped_storage().data_ptr()
            for buffer in self.model.buffers()
            if buffer.is_floating_point() and buffer.numel() > 0
        }
        for module in self.model.modules():
            if _is_rotary(module):
                self._hook(module, "rotary_depth")
            elif _is_attention(module):
                self._hook(module, "attention_depth")
        return self

    def _hook(self, module: torch.nn.Module, counter: str) -> None:
        def enter(*_: Any) -> None:
            setattr(self, counter, getattr(self, counter) + 1)

        def leave(*_: Any) -> None:
            setattr(self, counter, getattr(self, counter) - 1)

        self._handles.append(module.register_forward_pre_hook(enter))
        self._handles.append(module.register_forward_hook(leave, always_call=True))

    def __exit__(self, *_: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.rotary_depth = self.attention_depth = 0

    def is_buffer(self, value: Any) -> bool:
        """``value`` is a tensor that is, or views, one of the model's floating buffers."""
        if not self._buffers or not isinstance(value, torch.Tensor) or value.numel() == 0:
            return False
        return value.untyped_storage().data_ptr() in self._buffers

    @property
    def in_float32_zone(self) -> bool:
        return self.rotary_depth > 0


class RuledProducts(Float32Compute):
    """:class:`Float32Compute` whose weight and attention products (see the module docstring) run through the
    subclass's reduced-precision ``weight_product``, ``pair_product`` and ``attention``; every other function is the
    float32 compute's.

    Args:
        compute_dtype: the mode's name for messages (``"fp16"``, ``"tf32"``).
        keep_upcast: see :class:`Float32Compute`.
        zones: the model's :class:`ModelZones` (entered by the caller).
    """

    def __init__(self, compute_dtype: str, keep_upcast: torch.Tensor | None, zones: ModelZones) -> None:
        super().__init__(keep_upcast)
        self.compute_dtype = compute_dtype
        self.zones = zones

    def weight_product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` (weight (out, in)) in the mode's precision, float32 (..., out) result."""
        raise NotImplementedError

    def pair_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b`` (eager attention's q·kᵀ, p·v; broadcasting as ``torch.matmul``), float32 result."""
        raise NotImplementedError

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """``F.scaled_dot_product_attention`` in the mode's precision, float32 result."""
        raise NotImplementedError

    def _reduced_allowed(self, *operands: Any) -> bool:
        return not self.zones.in_float32_zone and not any(self.zones.is_buffer(value) for value in operands)

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is F.linear:
            given = dict(zip(("input", "weight", "bias"), args, strict=False)) | kwargs
            if self._reduced_allowed(given["input"], given["weight"]):
                return self.weight_product(given["input"], given["weight"], given.get("bias"))
        elif func is torch.addmm and len(args) == 3 and not kwargs:
            bias, x, weight = args  # bias + x @ weight: GPT-2-style Conv1D layers, weight (in, out)
            if self._reduced_allowed(x, weight):
                return self.weight_product(x, weight.t(), bias)
        elif func is F.scaled_dot_product_attention:
            if self._reduced_allowed(*args[:3], kwargs.get("attn_mask")):
                return self.attention(*args, **kwargs)
        elif func in _TWO_OPERANDS and len(args) == 2 and not kwargs:
            if self.zones.attention_depth > 0 and self._reduced_allowed(*args):
                return self.pair_product(*args)
        elif func in _GROUPED_MM:
            raise _refuse_grouped_mm(self.compute_dtype)
        return super().__torch_function__(func, types, args, kwargs)


def refuse_for_model(model: Any, compute_dtype: str) -> None:
    """Raise :func:`compute_dtype_refusal`'s line for ``model``'s config as a RuntimeError, if there is one."""
    refusal = compute_dtype_refusal(getattr(model, "config", None), compute_dtype)
    if refusal is not None:
        raise RuntimeError(refusal)

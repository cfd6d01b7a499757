"""Float32 compute whose matmuls read fp16 inputs: what ``replay.compute_dtype: fp16`` runs.

Why fp16 and not float32 or TF32 on a GPU: float32 matmuls run on CUDA cores, several times slower than the
tensor cores bf16 uses, and TF32 tensor cores run at half bf16's rate. fp16 tensor cores run at bf16's rate but
read 10 bits of mantissa (bf16: 7), as TF32 does, and accumulate in float32. The replay's relevance is sensitive to
the bits a matmul reads, not to the unit: on the three task families TF32-rounded inputs moved q by at most
0.002–0.009 against the float32 model, bf16 inputs by 0.04–0.08 (``benchmarks/replay_numerics_latest.md``).

Within :func:`fp16_matmul_compute`

- everything but the matmuls computes in float32, as in :func:`~mrtpo_verl.replay.float32_compute.float32_compute`
  (residual stream, norms, softmax, embedding rows; autocast off; low-precision norm weights upcast);
- ``F.linear`` (projections, MLP, LM head), ``addmm`` (GPT-2-style ``Conv1D`` layers), ``matmul``/``bmm`` and
  ``scaled_dot_product_attention`` take their tensor inputs as fp16 and give float32 outputs:

  - an activation is first multiplied by a power of two that brings its largest magnitude to at most 2**15, when
    it is larger (the residual stream of some models holds "massive activations" beyond fp16's 65504); a power of
    two moves no mantissa bit, so the rounding is fp16's own, and the output is divided by it again;
  - attention's query and key are balanced by one power of two, ``q·c`` and ``k/c`` (the same logits), so that
    neither alone leaves fp16's range; its value is scaled as an activation;
  - a weight is cast to fp16 as it is (an LLM's weights are far inside fp16's range); weights already gathered in
    fp16 (the colocated replay asks FSDP2 for that) are used as they are, and the LM head's copy is made once.

- On CUDA the products run on fp16 tensor cores: ``torch.mm(..., out_dtype=torch.float32)`` (float32 accumulation
  and output), attention through fp16 ``scaled_dot_product_attention``. Elsewhere they are emulated: the fp16 values
  widened to float32 and multiplied in IEEE float32. The product of two fp16 numbers (11-bit significands) is exact
  in float32 (24 bits), so the emulation gives the tensor cores' result up to the order of summation; a CPU has no
  fast fp16 unit, so the emulation takes float32's time. That is how this repository's CPU tests and benchmarks
  measure the fp16 path's agreement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from mrtpo_verl.replay.float32_compute import Float32Compute, matmul_precision

__all__ = [
    "FP16_HEADROOM_EXPONENT",
    "Float16Matmuls",
    "float32_output_mm_missing",
    "fp16_matmul_compute",
    "require_float32_output_mm",
    "to_fp16_scaled",
]

#: Activations whose largest magnitude exceeds 2**this are scaled down by a power of two before the fp16 cast
#: (fp16's largest finite value is 65504 < 2**16; one binade of headroom for rounding up).
FP16_HEADROOM_EXPONENT = 15

_TWO_OPERANDS: frozenset[Callable[..., Any]] = frozenset(
    {torch.matmul, torch.bmm, torch.mm, torch.Tensor.matmul, torch.Tensor.__matmul__}
)


def _amax(value: torch.Tensor) -> torch.Tensor:
    """|value|'s largest magnitude, 0-dim float32: one reduction kernel reading ``value`` once."""
    return torch.linalg.vector_norm(value.detach(), float("inf")).float()


def _scale_down(value: torch.Tensor) -> torch.Tensor:
    """A 0-dim float32 power of two ≤ 1, on ``value``'s device: 2**-(e - 15) for the exponent e that bounds
    |value|'s largest magnitude (e = ceil(log2 amax)), else 1. Computed on the device (no host synchronisation)."""
    exponent = torch.ceil(torch.log2(_amax(value).clamp(min=1.0))) - FP16_HEADROOM_EXPONENT
    return torch.exp2(-exponent.clamp(min=0.0))


def to_fp16_scaled(value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``value`` (any shape, a floating dtype) → (``value · s`` in fp16, ``s``): ``s`` a power of two ≤ 1 (a 0-dim
    float32 tensor) that keeps the largest magnitude ≤ 2**15, 1 when it already is.

    Two kernels over ``value``: the reduction, and the multiply written straight into fp16 (``out=``), so the scaling
    costs one extra read of the activation beside the cast itself."""
    scale = _scale_down(value)
    scaled = torch.empty_like(value, dtype=torch.float16)
    torch.mul(value, scale, out=scaled)
    return scaled, scale


def _widen(value: torch.Tensor) -> torch.Tensor:
    """An fp16 tensor as float32 for the emulated product (exact)."""
    return value.float()


def fp16_linear(x: torch.Tensor, weight16: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with fp16 inputs and float32 accumulation and output.

    Args:
        x: (..., in) activations, any floating dtype.
        weight16: (out, in) fp16.
        bias: (out,) or None, added in float32 after the product.

    Returns:
        (..., out) float32.
    """
    x16, scale = to_fp16_scaled(x)
    if x16.is_cuda:
        flat = torch.mm(x16.reshape(-1, x16.shape[-1]), weight16.t(), out_dtype=torch.float32)
        out = flat.reshape(*x16.shape[:-1], weight16.shape[0])
    else:
        out = F.linear(_widen(x16), _widen(weight16))
    out = out / scale
    return out if bias is None else out + bias.float()


def fp16_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of two activations (eager attention's q·kᵀ and p·v) with fp16 inputs, float32 result. On CUDA the
    product is an fp16 tensor-core matmul whose output fp16 rounds once more (no ``out_dtype`` for batched
    matmuls); emulated elsewhere without that rounding."""
    a16, scale_a = to_fp16_scaled(a)
    b16, scale_b = to_fp16_scaled(b)
    out = torch.matmul(a16, b16).float() if a16.is_cuda else torch.matmul(_widen(a16), _widen(b16))
    return out / (scale_a * scale_b)


def _fp16_mask(mask: Any) -> Any:
    """A float additive mask in fp16 (CUDA's fp16 attention needs the query's dtype): clamped at fp16's lowest,
    so a row masked with float32's lowest value stays a finite, uniform row, as it is in float32."""
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():
        return mask.float().clamp(min=torch.finfo(torch.float16).min).half()
    return mask


def fp16_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``F.scaled_dot_product_attention`` on fp16 q, k, v (float32 result).

    ``q·c`` and ``k/c`` with c = 2**round(log2(amax k / amax q) / 2) keep the logits and put q and k at the same
    magnitude; v is scaled down like an activation and the output divided back. On CUDA fp16 attention kernels
    (float32 softmax, fp16 output); elsewhere float32 attention on the fp16-rounded inputs, its output rounded to
    fp16 as a kernel's is.
    """
    balance = torch.exp2(torch.round(torch.log2(_amax(key).clamp(min=1e-30) / _amax(query).clamp(min=1e-30)) / 2))
    q16 = torch.empty_like(query, dtype=torch.float16)
    k16 = torch.empty_like(key, dtype=torch.float16)
    torch.mul(query, balance, out=q16)
    torch.div(key, balance, out=k16)
    v16, v_scale = to_fp16_scaled(value)
    if q16.is_cuda:
        if args:
            args = (_fp16_mask(args[0]), *args[1:])
        if "attn_mask" in kwargs:
            kwargs = {**kwargs, "attn_mask": _fp16_mask(kwargs["attn_mask"])}
        out = F.scaled_dot_product_attention(q16, k16, v16, *args, **kwargs).float()
    else:
        out = F.scaled_dot_product_attention(_widen(q16), _widen(k16), _widen(v16), *args, **kwargs)
        out = out.half().float()
    return out / v_scale


class Float16Matmuls(Float32Compute):
    """:class:`Float32Compute` whose matmuls read fp16 inputs (see the module docstring).

    Args:
        keep_upcast: a weight (the LM head's) whose fp16 copy is made once and reused for the context's lifetime.
    """

    def _fp16(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.dtype == torch.float16:
            return weight
        kept = self._kept_as(weight, torch.float16)
        return weight.half() if kept is None else kept

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is F.linear:
            names = ("input", "weight", "bias")
            given = dict(zip(names, args, strict=False)) | kwargs
            return fp16_linear(given["input"], self._fp16(given["weight"]), given.get("bias"))
        if func in _TWO_OPERANDS and len(args) == 2 and not kwargs:
            return fp16_matmul(*args)
        if func is torch.addmm and len(args) == 3 and not kwargs:
            bias, x, weight = args  # bias + x @ weight: GPT-2-style Conv1D layers, weight (in, out)
            return fp16_linear(x, self._fp16(weight).t(), bias)
        if func is F.scaled_dot_product_attention:
            return fp16_attention(*args, **kwargs)
        return super().__torch_function__(func, types, args, kwargs)


_MISSING: dict[str, str | None] = {}


def float32_output_mm_missing(device: str | torch.device) -> str | None:
    """None where ``torch.mm(fp16, fp16, out_dtype=torch.float32)`` runs on ``device`` (CUDA in recent torch),
    else why not, in one line; probed once per device."""
    key = str(device)
    if key not in _MISSING:
        probe = torch.ones(2, 2, dtype=torch.float16, device=device)
        try:
            torch.mm(probe, probe, out_dtype=torch.float32)
            _MISSING[key] = None
        except (RuntimeError, NotImplementedError, TypeError) as error:
            _MISSING[key] = str(error).splitlines()[0] if str(error) else type(error).__name__
    return _MISSING[key]


def require_float32_output_mm(device: str | torch.device) -> None:
    """Raise a one-line error unless fp16 matmuls with float32 output run on ``device``. Without them the fp16 path
    would round every product to fp16 and could overflow, so it refuses to run rather than fall back silently."""
    missing = float32_output_mm_missing(device)
    if missing is not None:
        raise RuntimeError(
            f"mrtpo.replay.compute_dtype=fp16 needs fp16 matmuls with float32 output (torch.mm out_dtype) on "
            f"{device}, which torch {torch.__version__} does not run there ({missing}); use compute_dtype fp32 or tf32"
        )


@contextmanager
def fp16_matmul_compute(device: torch.device | str, keep_upcast: torch.Tensor | None = None) -> Iterator[None]:
    """Autocast off on ``device``'s type and :class:`Float16Matmuls` on, for the block's forward passes. torch's float32
    matmul precision is pinned to ``"highest"`` so that the emulated products (a CPU's) are IEEE float32 products of
    the fp16 values, as tensor cores form them. On CUDA, :func:`require_float32_output_mm` on ``device`` first."""
    device = torch.device(device)
    if device.type == "cuda":
        require_float32_output_mm(device)
    with (
        matmul_precision("highest"),
        torch.autocast(device_type=device.type, enabled=False),
        Float16Matmuls(keep_upcast),
    ):
        yield

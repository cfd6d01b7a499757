"""Float32 compute whose weight and attention products read fp16 inputs: what ``replay.compute_dtype: fp16`` runs.

Why fp16 and not float32 or TF32 on a GPU: float32 matmuls run on CUDA cores, several times slower than the
tensor cores bf16 uses, and TF32 tensor cores run at half bf16's rate. fp16 tensor cores run at bf16's rate but
read 10 bits of mantissa (bf16: 7), as TF32 does, and accumulate in float32. The replay's relevance is sensitive to
the bits a product reads, not to the unit (figures: ``benchmarks/replay_numerics_latest.md``).

Within :func:`fp16_matmul_compute`

- everything computes in float32 as in :func:`~mrtpo_verl.replay.float32_compute.float32_compute` (residual stream,
  norms, softmax, embedding rows; autocast off; low-precision weights upcast), with torch's float32 matmul precision
  pinned to ``"highest"`` (IEEE float32);
- only the products :mod:`~mrtpo_verl.replay.product_rule` names — the model's weight products (``F.linear``: the
  projections, MLP and LM head; ``addmm``: GPT-2-style ``Conv1D``) and attention's q·kᵀ and p·v
  (``scaled_dot_product_attention``; eager attention's two matmuls) — take their inputs as fp16 and give float32
  outputs. The rotary embedding's ``inv_freq @ position_ids``, any product with a module buffer and every other
  product stay IEEE float32, so positions keep all their bits at any context length;

  - an activation is first multiplied by a power of two that brings its largest magnitude to at most 2**15, when
    it is larger (the residual stream of some models holds "massive activations" beyond fp16's 65504); a power of
    two moves no mantissa bit, so the rounding is fp16's own, and the output is divided by it again;
  - attention's query and key are balanced by one power of two, ``q·c`` and ``k/c`` (the same logits), so that
    neither alone leaves fp16's range; its value is scaled as an activation;
  - a weight is cast to fp16 as it is (an LLM's weights are far inside fp16's range); weights already gathered in
    fp16 (the colocated replay asks FSDP2 for that) are used as they are, and the LM head's copy is made once.

The products run through one of two kernel sets (:class:`Fp16Kernels`); everything around the kernels (scaling,
flattening to 2-D / 3-D products, balancing, unscaling) is the same code for both:

- CUDA (:func:`cuda_fp16_kernels`): ``torch.mm(..., out_dtype=torch.float32)`` and
  ``torch.bmm(..., out_dtype=torch.float32)`` (fp16 tensor cores, float32 accumulation *and output*: no product is
  rounded to fp16 or can overflow it), and fp16 ``scaled_dot_product_attention`` (flash / memory-efficient kernels).
- emulation (:func:`emulated_fp16_kernels`; elsewhere than CUDA, or anywhere inside
  :func:`~mrtpo_verl.replay.product_rule.emulated_products`): the fp16 values widened to float32 and multiplied in
  IEEE float32. The product of two fp16 numbers (11-bit significands) is exact in float32 (24 bits), so the emulation
  gives the tensor cores' result up to the order of summation. Attention is emulated as CUDA's fp16 kernels compute
  it (:func:`emulated_fp16_attention`): logits ``q·kᵀ`` in float32 from the fp16 inputs, scaled and masked;
  ``e = exp(logits − row max)`` in float32; ``e`` **rounded to fp16** before ``e·v`` (the kernels hold the
  probabilities in fp16 for their second product); ``e·v`` accumulated in float32 and divided by the float32 row sum
  of the unrounded ``e``; the **output rounded to fp16** (the kernels' output dtype). Eager attention's two matmuls
  are pair products (fp16 inputs, float32 output) on both kernel sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from mrtpo_verl.replay.float32_compute import matmul_precision
from mrtpo_verl.replay.product_rule import ModelZones, RuledProducts, emulation_forced, refuse_for_model

__all__ = [
    "FP16_HEADROOM_EXPONENT",
    "Float16Matmuls",
    "Fp16Kernels",
    "cuda_fp16_kernels",
    "emulated_fp16_attention",
    "emulated_fp16_kernels",
    "float32_output_mm_missing",
    "fp16_attention",
    "fp16_linear",
    "fp16_matmul",
    "fp16_matmul_compute",
    "require_float32_output_mm",
    "to_fp16_scaled",
]

#: Activations whose largest magnitude exceeds 2**this are scaled down by a power of two before the fp16 cast
#: (fp16's largest finite value is 65504 < 2**16; one binade of headroom for rounding up).
FP16_HEADROOM_EXPONENT = 15

#: Query rows per block of the emulated attention (bounds its (heads, rows, keys) float32 logits).
EMULATED_ATTENTION_ROWS = 256


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


@dataclass(frozen=True)
class Fp16Kernels:
    """The three kernels the fp16 products run on.

    Attributes:
        name: ``"cuda"`` or ``"emulated"``.
        mm: (m, k) fp16 @ (k, n) fp16 → (m, n) float32.
        bmm: (b, m, k) fp16 @ (b, k, n) fp16 → (b, m, n) float32.
        attention: ``scaled_dot_product_attention`` on fp16 q, k, v (its other arguments as torch's) → float32
            values of an fp16 output.
    """

    name: str
    mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bmm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    attention: Callable[..., torch.Tensor]


def _fp16_mask(mask: Any) -> Any:
    """A float additive mask in fp16 (CUDA's fp16 attention needs the query's dtype): clamped at fp16's lowest,
    so a row masked with float32's lowest value stays a finite, uniform row, as it is in float32."""
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():
        return mask.float().clamp(min=torch.finfo(torch.float16).min).half()
    return mask


def _sdpa_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``scaled_dot_product_attention``'s arguments after q, k, v, by name."""
    names = ("attn_mask", "dropout_p", "is_causal", "scale")
    given = dict(zip(names, args, strict=False)) | kwargs
    unknown = set(given) - {*names, "enable_gqa"}
    if unknown:
        raise TypeError(f"scaled_dot_product_attention got unexpected arguments {sorted(unknown)}")
    return given


def _cuda_attention(q16: torch.Tensor, k16: torch.Tensor, v16: torch.Tensor, **given: Any) -> torch.Tensor:
    """fp16 ``scaled_dot_product_attention`` (CUDA's flash / memory-efficient kernels), its fp16 output widened."""
    given = {**given, "attn_mask": _fp16_mask(given.get("attn_mask"))}
    return F.scaled_dot_product_attention(q16, k16, v16, **given).float()


def emulated_fp16_attention(
    q16: torch.Tensor,
    k16: torch.Tensor,
    v16: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """CUDA's fp16 attention computed in IEEE float32 (see the module docstring for what is rounded where).

    Args:
        q16: (..., Hq, L, E) fp16. k16, v16: (..., Hk, S, E) fp16 (Hk = Hq, or a divisor with ``enable_gqa``).
        attn_mask: None, bool (True = attend) or additive float, broadcastable to (..., Hq, L, S).
        is_causal: query row i attends keys 0..i (torch's top-left alignment).
        scale: the logits' factor (default 1/sqrt(E)).

    Returns:
        (..., Hq, L, E) float32 holding fp16 values; a row that attends no key gives 0.
    """
    if dropout_p:
        raise ValueError("the replay's fp16 attention runs without dropout (dropout_p must be 0)")
    query, key, value = q16.float(), k16.float(), v16.float()
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    rows, keys = query.shape[-2], key.shape[-2]
    mask = _fp16_mask(attn_mask)
    blocks = []
    for first in range(0, rows, EMULATED_ATTENTION_ROWS):
        last = min(rows, first + EMULATED_ATTENTION_ROWS)
        width = min(keys, last) if is_causal else keys  # keys past the block's last causal column get weight 0
        logits = (query[..., first:last, :] @ key[..., :width, :].transpose(-1, -2)) * factor
        allowed = None
        if is_causal:
            allowed = torch.ones(last - first, width, dtype=torch.bool, device=query.device).tril(first)
        if isinstance(mask, torch.Tensor):
            block = mask[..., first:last, :width] if mask.shape[-2] != 1 else mask[..., :width]
            if block.dtype == torch.bool:
                allowed = block if allowed is None else allowed & block
            else:
                logits = logits + block.float()
        if allowed is not None:
            logits = logits.masked_fill(~allowed, float("-inf"))
        row_max = logits.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        weights = torch.exp(logits - row_max)
        total = weights.sum(dim=-1, keepdim=True)
        out = (weights.half().float() @ value[..., :width, :]) / total
        blocks.append(torch.where(total > 0, out, torch.zeros_like(out)))
    return torch.cat(blocks, dim=-2).half().float()


def cuda_fp16_kernels() -> Fp16Kernels:
    """CUDA's kernels: fp16 tensor-core products with float32 output (``out_dtype``), fp16 flash attention."""
    return Fp16Kernels(
        "cuda",
        lambda a, b: torch.mm(a, b, out_dtype=torch.float32),
        lambda a, b: torch.bmm(a, b, out_dtype=torch.float32),
        _cuda_attention,
    )


def emulated_fp16_kernels() -> Fp16Kernels:
    """The emulation: fp16 values widened to float32, IEEE float32 products; attention as CUDA's kernels round it."""
    return Fp16Kernels(
        "emulated",
        lambda a, b: torch.mm(a.float(), b.float()),
        lambda a, b: torch.bmm(a.float(), b.float()),
        emulated_fp16_attention,
    )


def fp16_linear(
    x: torch.Tensor, weight16: torch.Tensor, bias: torch.Tensor | None, kernels: Fp16Kernels | None = None
) -> torch.Tensor:
    """``F.linear`` with fp16 inputs and float32 accumulation and output.

    Args:
        x: (..., in) activations, any floating dtype.
        weight16: (out, in) fp16.
        bias: (out,) or None, added in float32 after the product.
        kernels: the kernel set (default: the emulation).

    Returns:
        (..., out) float32.
    """
    kernels = kernels or emulated_fp16_kernels()
    x16, scale = to_fp16_scaled(x)
    flat = kernels.mm(x16.reshape(-1, x16.shape[-1]), weight16.t())
    out = flat.reshape(*x16.shape[:-1], weight16.shape[0]) / scale
    return out if bias is None else out + bias.float()


def fp16_matmul(a: torch.Tensor, b: torch.Tensor, kernels: Fp16Kernels | None = None) -> torch.Tensor:
    """``a @ b`` of two activations (eager attention's q·kᵀ and p·v) with fp16 inputs and a float32 result, with
    ``torch.matmul``'s broadcasting: the batch dimensions are broadcast and flattened into one float32-output ``bmm``
    (an ``mm`` for two matrices)."""
    kernels = kernels or emulated_fp16_kernels()
    a16, scale_a = to_fp16_scaled(a)
    b16, scale_b = to_fp16_scaled(b)
    vector_a, vector_b = a16.dim() == 1, b16.dim() == 1
    if vector_a:
        a16 = a16.unsqueeze(0)
    if vector_b:
        b16 = b16.unsqueeze(-1)
    rows, inner, cols = a16.shape[-2], a16.shape[-1], b16.shape[-1]
    if a16.dim() == b16.dim() == 2:
        out = kernels.mm(a16, b16)
    else:
        batch = torch.broadcast_shapes(a16.shape[:-2], b16.shape[:-2])
        flat_a = a16.expand(*batch, rows, inner).reshape(-1, rows, inner)
        flat_b = b16.expand(*batch, inner, cols).reshape(-1, inner, cols)
        out = kernels.bmm(flat_a, flat_b).reshape(*batch, rows, cols)
    if vector_a:
        out = out.squeeze(-2)
    if vector_b:
        out = out.squeeze(-1)
    return out / (scale_a * scale_b)


def fp16_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    kernels: Fp16Kernels | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` on fp16 q, k, v (float32 result).

    ``q·c`` and ``k/c`` with c = 2**round(log2(amax k / amax q) / 2) keep the logits and put q and k at the same
    magnitude; v is scaled down like an activation and the output divided back. The attention itself is
    ``kernels.attention`` (CUDA's fp16 kernels or :func:`emulated_fp16_attention`).
    """
    kernels = kernels or emulated_fp16_kernels()
    given = _sdpa_arguments(args, kwargs)
    balance = torch.exp2(torch.round(torch.log2(_amax(key).clamp(min=1e-30) / _amax(query).clamp(min=1e-30)) / 2))
    q16 = torch.empty_like(query, dtype=torch.float16)
    k16 = torch.empty_like(key, dtype=torch.float16)
    torch.mul(query, balance, out=q16)
    torch.div(key, balance, out=k16)
    v16, v_scale = to_fp16_scaled(value)
    return kernels.attention(q16, k16, v16, **given) / v_scale


class Float16Matmuls(RuledProducts):
    """The fp16 mode: weight and attention products (:mod:`~mrtpo_verl.replay.product_rule`) on fp16 inputs with
    float32 output, every other function the float32 compute's.

    Args:
        keep_upcast: a weight (the LM head's) whose fp16 copy is made once and reused for the context's lifetime.
        zones: the model's entered :class:`~mrtpo_verl.replay.product_rule.ModelZones` (default: none).
        kernels: the kernel set (default: the emulation).
    """

    def __init__(
        self,
        keep_upcast: torch.Tensor | None = None,
        zones: ModelZones | None = None,
        kernels: Fp16Kernels | None = None,
    ) -> None:
        super().__init__("fp16", keep_upcast, zones or ModelZones(None))
        self.kernels = kernels or emulated_fp16_kernels()

    def _fp16(self, weight: torch.Tensor) -> torch.Tensor:
        if weight.dtype == torch.float16:
            return weight
        kept = self._kept_as(weight, torch.float16)
        return weight.half() if kept is None else kept

    def weight_product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return fp16_linear(x, self._fp16(weight), bias, self.kernels)

    def pair_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fp16_matmul(a, b, self.kernels)

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return fp16_attention(query, key, value, *args, kernels=self.kernels, **kwargs)


_MISSING: dict[str, str | None] = {}


def float32_output_mm_missing(device: str | torch.device) -> str | None:
    """None where ``torch.mm`` and ``torch.bmm`` of fp16 inputs with ``out_dtype=torch.float32`` run on ``device``
    (CUDA in recent torch), else why not, in one line; probed once per device."""
    key = str(device)
    if key not in _MISSING:
        probe = torch.ones(2, 2, dtype=torch.float16, device=device)
        try:
            torch.mm(probe, probe, out_dtype=torch.float32)
            torch.bmm(probe[None], probe[None], out_dtype=torch.float32)
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
            f"mrtpo.replay.compute_dtype=fp16 needs fp16 matmuls with float32 output (torch.mm/bmm out_dtype) on "
            f"{device}, which torch {torch.__version__} does not run there ({missing}); use compute_dtype fp32 or tf32"
        )


@contextmanager
def fp16_matmul_compute(
    device: torch.device | str,
    keep_upcast: torch.Tensor | None = None,
    model: Any = None,
    emulate: bool | None = None,
) -> Iterator[None]:
    """Autocast off on ``device``'s type, torch's float32 matmul precision ``"highest"`` and :class:`Float16Matmuls`
    on, for the block's forward passes.

    Args:
        device: the device the passes run on.
        keep_upcast: see :class:`Float16Matmuls`.
        model: the model whose rotary / attention modules and buffers the rule reads
            (:class:`~mrtpo_verl.replay.product_rule.ModelZones`); a mixture-of-experts model is refused in one line.
        emulate: True: :func:`emulated_fp16_kernels`; False: :func:`cuda_fp16_kernels`
            (:func:`require_float32_output_mm` first); None: emulated unless ``device`` is CUDA and no
            :func:`~mrtpo_verl.replay.product_rule.emulated_products` block is open.
    """
    device = torch.device(device)
    if emulate is None:
        emulate = emulation_forced() or device.type != "cuda"
    refuse_for_model(model, "fp16")
    if not emulate:
        require_float32_output_mm(device)
    kernels = emulated_fp16_kernels() if emulate else cuda_fp16_kernels()
    with (
        matmul_precision("highest"),
        torch.autocast(device_type=device.type, enabled=False),
        ModelZones(model) as zones,
        Float16Matmuls(keep_upcast, zones, kernels),
    ):
        yield

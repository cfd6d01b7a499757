"""Float32 compute whose weight and attention products read TF32 inputs: what ``replay.compute_dtype: tf32`` runs.

TF32 tensor cores read float32 inputs rounded to 10 mantissa bits (fp16's and TF32's precision; bf16: 7) and
accumulate in float32. As for fp16 (:mod:`~mrtpo_verl.replay.fp16_matmuls`), only the products
:mod:`~mrtpo_verl.replay.product_rule` names are reduced — the model's weight products (``F.linear``, ``addmm``) and
attention's q·kᵀ and p·v — and every other product (the rotary embedding's ``inv_freq @ position_ids``, products with
a module buffer, position arithmetic) stays IEEE float32. Setting torch's float32 matmul precision to ``"high"`` for
the whole forward would also round the rotary product's positions (above 2,048 they lose low bits), so the precision
is chosen per product instead.

Within :func:`tf32_matmul_compute` (autocast off, low-precision weights upcast, torch's float32 matmul precision
``"highest"`` for the block):

- **on CUDA** (``emulate=False``): weight products and eager attention's matmuls run with the precision switched to
  ``"high"`` for that one product (TF32 tensor cores: both operands rounded, float32 accumulation);
  ``scaled_dot_product_attention`` gets q, k and v rounded to TF32 (:func:`~mrtpo_verl.replay.product_rule.to_tf32`)
  and runs in float32 at ``"highest"``, so its probabilities stay float32 whichever float32 attention kernel torch
  picks;
- **emulated** (``emulate=True``; any device): the inputs of exactly those products are rounded with
  :func:`~mrtpo_verl.replay.product_rule.to_tf32` and multiplied in IEEE float32 — the ``@`` operator
  (``Tensor.__matmul__``) of eager attention included, the rotary product excluded. Attention is computed exactly as
  on CUDA (TF32-rounded q, k, v; float32 attention).

On a CPU, ``compute_dtype: tf32`` means IEEE float32 for users (a CPU has no TF32 unit; the replay then enters the
float32 compute, not this mode); the emulation is reached with
:func:`~mrtpo_verl.replay.product_rule.emulated_products` (:func:`tf32_in_effect`) or ``emulate=True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from mrtpo_verl.replay.float32_compute import matmul_precision
from mrtpo_verl.replay.product_rule import ModelZones, RuledProducts, emulation_forced, refuse_for_model, to_tf32

__all__ = ["Tf32Matmuls", "tf32_in_effect", "tf32_matmul_compute"]


def tf32_in_effect(device: torch.device | str) -> bool:
    """True where ``compute_dtype: tf32`` reduces products: on CUDA, or inside
    :func:`~mrtpo_verl.replay.product_rule.emulated_products` on any device; elsewhere it is IEEE float32."""
    return torch.device(device).type == "cuda" or emulation_forced()


class Tf32Matmuls(RuledProducts):
    """The TF32 mode (see the module docstring).

    Args:
        keep_upcast: a weight (the LM head's) whose float32 copy (TF32-rounded when emulating) is made once.
        zones: the model's entered :class:`~mrtpo_verl.replay.product_rule.ModelZones` (default: none).
        emulate: round the reduced products' inputs with ``to_tf32`` (True) or let TF32 tensor cores read them
            (False: torch's precision ``"high"`` for the product).
        device_type: without emulation, ``"cuda"`` switches to ``"high"`` per product; any other device keeps
            ``"highest"`` (no TF32 unit: IEEE float32).
    """

    def __init__(
        self,
        keep_upcast: torch.Tensor | None = None,
        zones: ModelZones | None = None,
        emulate: bool = True,
        device_type: str = "cuda",
    ) -> None:
        super().__init__("tf32", keep_upcast, zones or ModelZones(None))
        self.emulate = emulate
        self._precision = "high" if device_type == "cuda" else "highest"
        self._kept_rounded: torch.Tensor | None = None

    def _float32(self, value: torch.Tensor) -> torch.Tensor:
        upcast: torch.Tensor = self._argument(value)
        return upcast if upcast.dtype == torch.float32 else upcast.float()

    def _operand(self, value: torch.Tensor) -> torch.Tensor:
        """The float32 operand the product reads: TF32-rounded when emulating (the kept weight rounded once)."""
        if not self.emulate:
            return self._float32(value)
        if self._keep is not None and value is self._keep:
            if self._kept_rounded is None:
                self._kept_rounded = to_tf32(self._float32(value))
            return self._kept_rounded
        return to_tf32(self._float32(value))

    def weight_product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        bias32 = None if bias is None else self._float32(bias)
        if self.emulate:
            return F.linear(self._operand(x), self._operand(weight), bias32)
        with matmul_precision(self._precision):
            return F.linear(self._float32(x), self._float32(weight), bias32)

    def pair_product(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.emulate:
            return torch.matmul(self._operand(a), self._operand(b))
        with matmul_precision(self._precision):
            return torch.matmul(self._float32(a), self._float32(b))

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attn_mask", args[0] if args else None)
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            mask = mask.float()
            if args:
                args = (mask, *args[1:])
            else:
                kwargs = {**kwargs, "attn_mask": mask}
        rounded = (to_tf32(self._float32(tensor)) for tensor in (query, key, value))
        return F.scaled_dot_product_attention(*rounded, *args, **kwargs)


@contextmanager
def tf32_matmul_compute(
    device: torch.device | str,
    keep_upcast: torch.Tensor | None = None,
    model: Any = None,
    emulate: bool | None = None,
) -> Iterator[None]:
    """Autocast off on ``device``'s type, torch's float32 matmul precision ``"highest"`` and :class:`Tf32Matmuls` on,
    for the block's forward passes.

    Args:
        device: the device the passes run on.
        keep_upcast: see :class:`Tf32Matmuls`.
        model: the model whose rotary / attention modules and buffers the rule reads; a mixture-of-experts model is
            refused in one line.
        emulate: None: emulated unless ``device`` is CUDA and no
            :func:`~mrtpo_verl.replay.product_rule.emulated_products` block is open. False on a device other than
            CUDA computes IEEE float32 (no TF32 unit there).
    """
    device = torch.device(device)
    if emulate is None:
        emulate = emulation_forced() or device.type != "cuda"
    refuse_for_model(model, "tf32")
    with (
        matmul_precision("highest"),
        torch.autocast(device_type=device.type, enabled=False),
        ModelZones(model) as zones,
        Tf32Matmuls(keep_upcast, zones, emulate, device.type),
    ):
        yield

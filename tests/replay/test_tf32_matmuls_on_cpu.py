"""``replay.compute_dtype: tf32``: TF32 only for the weight and attention products, IEEE float32 elsewhere.

A CPU has no TF32 unit: ``tf32`` is IEEE float32 there for users, and the emulation (inputs of exactly the products CUDA
runs in TF32 rounded to 10 mantissa bits) is reached with ``emulated_products()``. CUDA's branch switches torch's
float32 matmul precision to ``"high"`` for each reduced product and back to ``"highest"``; that switching is checked
here by watching the calls the mode makes (a CPU ignores the setting, so nothing else can show it without a GPU).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from mrtpo_verl.replay.product_rule import ModelZones, emulated_products, emulation_forced, to_tf32
from mrtpo_verl.replay.tf32_matmuls import Tf32Matmuls, tf32_in_effect, tf32_matmul_compute
from tests.replay.test_fp16_matmuls_on_cpu import ToyModel


def test_to_tf32_keeps_ten_mantissa_bits_rounding_to_nearest() -> None:
    one_ulp = 2.0**-10
    values = torch.tensor(
        [1.0 + one_ulp, 1.0 + one_ulp / 4, 1.0 + 3 * one_ulp / 4, 1.0 + one_ulp / 2, -(1.0 + one_ulp / 2)]
    )
    assert to_tf32(values).tolist() == [1.0 + one_ulp, 1.0, 1.0 + one_ulp, 1.0 + one_ulp, -(1.0 + one_ulp)]
    positions = torch.arange(2040, 2060).float()
    assert torch.equal(to_tf32(positions)[positions < 2048], positions[positions < 2048])
    assert not torch.equal(to_tf32(positions), positions)  # 2049 is not a TF32 number
    values = torch.randn(100)
    assert torch.equal(to_tf32(to_tf32(values)), to_tf32(values))


def test_the_emulation_rounds_weight_and_attention_products_only() -> None:
    torch.manual_seed(0)
    model = ToyModel()
    x, weight, bias = torch.randn(3, 4), torch.randn(6, 4), torch.randn(6)
    q, k, v = torch.randn(2, 5, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    positions = torch.arange(4090, 4100)[None]
    with tf32_matmul_compute("cpu", model=model, emulate=True):
        linear = F.linear(x, weight, bias)
        attended, with_buffer = model.attention(q, k, v)  # q @ kᵀ with the @ operator: rounded
        angles = model.rotary(positions)
        sdpa = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)
        bare = x @ x.T
    assert torch.equal(linear, F.linear(to_tf32(x), to_tf32(weight), bias))
    probabilities = torch.softmax(to_tf32(q) @ to_tf32(k).transpose(-1, -2), dim=-1)
    assert torch.equal(attended, to_tf32(probabilities) @ to_tf32(v))
    assert torch.equal(with_buffer, q @ model.attention.table)
    assert torch.equal(angles, model.rotary.inv_freq[None, :, None] @ positions[:, None, :].float())
    expected = F.scaled_dot_product_attention(to_tf32(q)[None], to_tf32(k)[None], to_tf32(v)[None], is_causal=True)
    assert torch.equal(sdpa, expected)
    assert torch.equal(bare, x @ x.T)
    assert not torch.equal(linear, F.linear(x, weight, bias))  # the rounding is there


class PrecisionWatch(TorchFunctionMode):
    """Records torch's float32 matmul precision at each product the TF32 mode issues (entered outside it)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        if func in (F.linear, torch.matmul, torch.Tensor.matmul, F.scaled_dot_product_attention):  # @ is Tensor.matmul
            self.seen.append((getattr(func, "__name__", str(func)), torch.get_float32_matmul_precision()))
        return func(*args, **(kwargs or {}))


def test_the_cuda_branch_switches_to_tf32_per_product() -> None:
    """On CUDA (no emulation) each weight product and eager attention's matmuls run at precision "high" (TF32), the
    rotary product, sdpa (on TF32-rounded q, k, v) and a bare matmul at "highest"; the block's setting is restored."""
    torch.manual_seed(0)
    model = ToyModel()
    x, weight = torch.randn(3, 4), torch.randn(6, 4)
    q = torch.randn(2, 5, 4)
    previous = torch.get_float32_matmul_precision()
    with PrecisionWatch() as watch, ModelZones(model) as zones, Tf32Matmuls(None, zones, emulate=False):
        F.linear(x, weight)
        model.attention(q, q, q)
        model.rotary(torch.arange(4090, 4100)[None])
        F.scaled_dot_product_attention(q[None], q[None], q[None])
    assert torch.get_float32_matmul_precision() == previous
    assert watch.seen == [
        ("linear", "high"),
        ("matmul", "high"),  # q @ kᵀ
        ("matmul", "high"),  # p @ v
        ("matmul", previous),  # q @ buffer
        ("matmul", previous),  # the rotary product
        ("scaled_dot_product_attention", previous),
    ]


def test_tf32_is_float32_on_a_cpu_unless_emulated() -> None:
    assert not tf32_in_effect("cpu") and tf32_in_effect("cuda")
    assert not emulation_forced()
    with emulated_products():
        assert tf32_in_effect("cpu") and emulation_forced()
    assert not emulation_forced()

"""The replay's float32 compute on a bf16 model: the real SmolLM2-135M-Instruct and two real Spider replays.

``compute_dtype="fp32"`` must give exactly the relevance of a float32 model whose weights are the bf16 weights
(the mechanism upcasts each weight at its use and nothing else), also under an outer bf16 autocast as verl's
engine forward sets one; and it must agree with the float32 model's own relevance within the goal the replay
is held to (max |Δq| ≤ 0.01, Pearson ≥ 0.99 per row), where the bf16 compute does not.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from mrtpo_verl.analysis.agreement import agreement, agreement_rows
from mrtpo_verl.config import MRTPOConfigError, ReplayConfig
from mrtpo_verl.replay.contexts import ReplayContexts
from mrtpo_verl.replay.float32_compute import float32_compute
from mrtpo_verl.replay.model_loading import cast_parameters
from mrtpo_verl.replay.scorer import ReplayScorer, cache_bytes_per_token

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models(smollm2: tuple[Any, Any]) -> dict[str, Any]:
    """The float32 model, its bf16 copy (parameters only, as clusters run it), and a float32 model holding the
    bf16-rounded weights."""
    model32, _ = smollm2
    model16 = cast_parameters(copy.deepcopy(model32), torch.bfloat16).eval()
    rounded = cast_parameters(copy.deepcopy(model16), torch.float32).eval()
    return {"fp32": model32, "bf16": model16, "bf16 weights in fp32": rounded}


def relevance(model: Any, items: list[ReplayContexts], compute_dtype: str) -> torch.Tensor:
    needed = torch.ones(len(items), len(items[0].leave_one_out_ids), dtype=torch.bool)
    return ReplayScorer(model, compute_dtype=compute_dtype).score(items, needed).relevance


def test_float32_compute_equals_the_float32_model_of_the_same_weights(
    models: dict[str, Any], replay_items: list[ReplayContexts]
) -> None:
    expected = relevance(models["bf16 weights in fp32"], replay_items, "fp32")
    torch.testing.assert_close(relevance(models["bf16"], replay_items, "fp32"), expected, atol=1e-5, rtol=0)
    # verl's engine forward runs under autocast to its param_dtype; the float32 compute turns it off.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = relevance(models["bf16"], replay_items, "fp32")
    torch.testing.assert_close(under_autocast, expected, atol=1e-5, rtol=0)
    # The model's own compute is another computation (else this test could not fail).
    assert (relevance(models["bf16"], replay_items, "model") - expected).abs().max() > 1e-3


def test_float32_compute_of_bf16_weights_agrees_with_float32(
    models: dict[str, Any], replay_items: list[ReplayContexts]
) -> None:
    lengths, real = agreement_rows(replay_items)
    reference = relevance(models["fp32"], replay_items, "fp32")
    fp32_compute = agreement(reference, relevance(models["bf16"], replay_items, "fp32"), lengths, real)
    bf16_compute = agreement(reference, relevance(models["bf16"], replay_items, "model"), lengths, real)
    print(f"bf16 weights, fp32 compute: {fp32_compute}\nbf16 compute: {bf16_compute}")
    assert fp32_compute["rows"] > 0
    assert fp32_compute["max_dq"] <= 0.01 and fp32_compute["pearson_min"] >= 0.99
    assert fp32_compute["max_dq"] < bf16_compute["max_dq"]


def test_only_weight_combining_functions_change() -> None:
    weight = torch.randn(6, 4).bfloat16()
    x = torch.randn(3, 4)
    with float32_compute("cpu"):
        assert F.linear(x, weight).dtype == torch.float32
        assert (x @ weight.T).dtype == torch.float32
        assert F.embedding(torch.tensor([0, 5]), weight).dtype == torch.float32
        assert weight.clone().dtype == torch.bfloat16  # every other function runs untouched
        assert (weight + weight).dtype == torch.bfloat16
    with pytest.raises(RuntimeError):
        F.linear(x, weight)  # outside the context a mixed-dtype linear is an error, as before


def test_the_cache_budget_counts_float32_keys_and_values(models: dict[str, Any]) -> None:
    config = models["bf16"].config
    budget = 1 << 30
    fp32 = ReplayScorer(models["bf16"], max_cache_bytes=budget, compute_dtype="fp32")
    model_dtype = ReplayScorer(models["bf16"], max_cache_bytes=budget, compute_dtype="model")
    assert fp32.max_cache_tokens == budget // cache_bytes_per_token(config, torch.float32)
    assert model_dtype.max_cache_tokens == budget // cache_bytes_per_token(config, torch.bfloat16)


def test_a_bad_compute_dtype_is_named() -> None:
    with pytest.raises(
        MRTPOConfigError,
        match=r"mrtpo.replay.compute_dtype: got 'bf16' \(allowed: auto \| fp32 \| tf32 \| fp16 \| model\)",
    ):
        ReplayConfig(compute_dtype="bf16").validate()


def test_a_float32_model_skips_the_mode_and_gives_the_same_relevance(
    models: dict[str, Any], replay_items: list[ReplayContexts], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 model held whole already computes in float32: the mode (per-call dispatch) is not entered, only
    the matmul precision is set."""
    from mrtpo_verl.replay import scorer as scorer_module
    from mrtpo_verl.replay.model_runners import LocalModelRunner

    assert LocalModelRunner(models["fp32"]).computes_in_float32()
    assert not LocalModelRunner(models["bf16"]).computes_in_float32()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an outer autocast would compute in bf16: the mode is needed
        assert not LocalModelRunner(models["fp32"]).computes_in_float32()
    entered = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        entered.append(kwargs.get("upcast", True))
        return float32_compute(*args, **kwargs)

    monkeypatch.setattr(scorer_module, "float32_compute", counting)
    fp32_compute = relevance(models["fp32"], replay_items, "fp32")
    assert entered and not any(entered)  # the precision only, no upcasting mode
    assert torch.equal(fp32_compute, relevance(models["fp32"], replay_items, "model"))
    entered.clear()
    relevance(models["bf16"], replay_items, "fp32")
    assert entered and all(entered)  # a bf16 model enters the mode


def test_the_float32_compute_sets_the_matmul_precision_and_restores_it() -> None:
    """A run's global setting ("medium" lets float32 matmuls run in bf16, "high" in TF32, the rotary embedding's
    position product included) does not reach the replay's float32 compute: IEEE float32 for the block, on any device
    (the CUDA branch needs no GPU: it sets torch's flag). TF32 is chosen per product by the tf32 mode instead."""
    previous = torch.get_float32_matmul_precision()
    try:
        for outside in ("medium", "high"):
            torch.set_float32_matmul_precision(outside)
            for device_type, upcast in (("cpu", True), ("cpu", False), ("cuda", True), ("cuda", False)):
                with float32_compute(device_type, upcast=upcast):
                    assert torch.get_float32_matmul_precision() == "highest"
                assert torch.get_float32_matmul_precision() == outside
        with pytest.raises(ValueError), float32_compute("cpu"):
            raise ValueError("a failing pass")
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(previous)


def test_tf32_on_a_cpu_is_the_fp32_compute(models: dict[str, Any], replay_items: list[ReplayContexts]) -> None:
    assert torch.equal(relevance(models["bf16"], replay_items, "tf32"), relevance(models["bf16"], replay_items, "fp32"))


def test_flash_attention_models_compute_in_float32_with_sdpa(
    models: dict[str, Any], replay_items: list[ReplayContexts]
) -> None:
    """verl builds its models with flash attention, which takes bf16/fp16 only (a float32 query is refused): the
    float32 compute runs sdpa instead; compute_dtype=model keeps the model's own implementation. The stand-in for
    flash attention (no flash-attn kernels on CPU) refuses float32 as flash-attn does and is sdpa otherwise."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    calls: list[torch.dtype] = []

    def half_precision_only(module: Any, query: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(query.dtype)
        if query.dtype == torch.float32:
            raise ValueError("FlashAttention only supports fp16 and bf16 data type")
        return sdpa_attention_forward(module, query, *args, **kwargs)

    AttentionInterface.register("flash_attention_cpu_stand_in", half_precision_only)
    model = models["bf16"]
    with_sdpa = relevance(model, replay_items, "fp32")
    model.config._attn_implementation_internal = "flash_attention_cpu_stand_in"
    try:
        assert torch.equal(relevance(model, replay_items, "fp32"), with_sdpa)
        assert calls == []
        assert model.config._attn_implementation == "flash_attention_cpu_stand_in"  # restored
        # transformers builds flash attention's masks its own way, which the stand-in does not follow: only which
        # implementation ran, in which dtype, is checked here.
        relevance(model, replay_items, "model")
        assert calls and set(calls) == {torch.bfloat16}
    finally:
        model.config._attn_implementation_internal = "sdpa"

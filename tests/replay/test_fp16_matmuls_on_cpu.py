"""``replay.compute_dtype: fp16``: float32 compute whose matmuls read fp16 inputs.

On a CPU the fp16 products are emulated (fp16 values widened to float32, IEEE float32 products, which are exact for
fp16 inputs); CUDA's branch runs the same inputs on fp16 tensor cores and cannot run here. What is checked: the
rounding is exactly fp16's, values beyond fp16's range are scaled instead of overflowing, the other functions are
the float32 compute's, and on the real SmolLM2-135M-Instruct with real Spider replays the relevance agrees with the
float32 model's within the replay's goal (max |Δq| ≤ 0.01, Pearson ≥ 0.99 per row) where bf16 compute does not.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from mrtpo_verl.analysis.agreement import agreement, agreement_rows
from mrtpo_verl.replay.contexts import ReplayContexts
from mrtpo_verl.replay.fp16_matmuls import (
    float32_output_mm_missing,
    fp16_attention,
    fp16_linear,
    fp16_matmul_compute,
    require_float32_output_mm,
    to_fp16_scaled,
)
from mrtpo_verl.replay.model_loading import cast_parameters
from mrtpo_verl.replay.scorer import ReplayScorer, cache_bytes_per_token


def _fp16_rounded(value: torch.Tensor) -> torch.Tensor:
    return value.half().float()


def test_a_linear_reads_fp16_rounded_inputs_and_gives_float32() -> None:
    torch.manual_seed(0)
    x, weight, bias = torch.randn(3, 5, 8), torch.randn(6, 8), torch.randn(6)
    out = fp16_linear(x, weight.half(), bias)
    assert out.dtype == torch.float32
    # Exactly fp16 rounding of both inputs, float32 products and sums (and the bias added in float32).
    assert torch.equal(out, F.linear(_fp16_rounded(x), _fp16_rounded(weight)) + bias)
    assert not torch.equal(out, F.linear(x, weight, bias))  # the rounding is there


def test_activations_beyond_fp16_are_scaled_not_overflowed() -> None:
    """A residual stream with "massive activations" (here 3e5 > 65504): a plain fp16 cast gives inf; the scaled
    cast divides by a power of two (no mantissa bit moves) and the product is multiplied back."""
    torch.manual_seed(0)
    x, weight = torch.randn(4, 16), torch.randn(8, 16) * 0.05
    x[1, 3] = 3.0e5
    assert torch.isinf(x.half()).any()
    scaled, scale = to_fp16_scaled(x)
    assert scale.item() == 2.0**-4  # 3e5 < 2**19: brought to at most 2**15
    assert torch.equal(scaled.float() / scale, _fp16_rounded(x / 16) * 16)
    out = fp16_linear(x, weight.half(), None)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, F.linear(x, weight), rtol=2e-3, atol=2e-3)
    # In range, nothing is scaled.
    assert to_fp16_scaled(torch.randn(4, 4))[1].item() == 1.0


def test_attention_balances_query_and_key_and_keeps_the_logits() -> None:
    """q about 1e6 and k about 1e-6: each alone leaves fp16's range (inf / zero) while their logits are ordinary;
    balanced by one power of two they stay in range and the attention is float32's within fp16 rounding."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 8) * 1e6, torch.randn(1, 2, 5, 8) * 1e-6, torch.randn(1, 2, 5, 8)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = fp16_attention(q, k, v, is_causal=True)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=0, atol=5e-3)
    assert not torch.isfinite(F.scaled_dot_product_attention(q.half().float(), k.half().float(), v)).all()


def test_the_mode_routes_matmuls_through_fp16_and_leaves_the_rest_float32() -> None:
    torch.manual_seed(0)
    weight16, x = torch.randn(6, 4).bfloat16(), torch.randn(3, 4)
    with fp16_matmul_compute("cpu"):
        out = F.linear(x, weight16)
        product = x @ x.T
        embedded = F.embedding(torch.tensor([0, 5]), weight16)
        conv1d = torch.addmm(torch.ones(6), x, weight16.T)  # GPT-2's Conv1D: bias + x @ weight (in, out)
        untouched = weight16 + weight16
    assert out.dtype == product.dtype == embedded.dtype == torch.float32
    assert torch.equal(out, F.linear(_fp16_rounded(x), weight16.float()))  # bf16 → fp16 is exact here
    assert torch.equal(product, _fp16_rounded(x) @ _fp16_rounded(x).T)
    assert conv1d.dtype == torch.float32 and torch.equal(conv1d, out + 1)
    assert torch.equal(embedded, weight16.float()[[0, 5]])  # a lookup: upcast, not rounded
    assert untouched.dtype == torch.bfloat16
    with pytest.raises(RuntimeError):
        F.linear(x, weight16)  # outside the context: the mixed-dtype error, as before


def test_a_device_without_float32_output_fp16_matmuls_is_refused_in_one_line() -> None:
    """CUDA's branch needs ``torch.mm(..., out_dtype=torch.float32)``; a device without it (this CPU build has no
    such kernel) gets a one-line error naming the option and the way out, not a silent fp16-output fallback."""
    with pytest.raises(
        RuntimeError, match=r"compute_dtype=fp16 needs .* on cpu, .*; use compute_dtype fp32 or tf32"
    ) as e:
        require_float32_output_mm("cpu")
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def models(smollm2: tuple[Any, Any]) -> dict[str, Any]:
    model32, _ = smollm2
    return {"fp32": model32, "bf16": cast_parameters(copy.deepcopy(model32), torch.bfloat16).eval()}


def relevance(model: Any, items: list[ReplayContexts], compute_dtype: str) -> torch.Tensor:
    needed = torch.ones(len(items), len(items[0].leave_one_out_ids), dtype=torch.bool)
    return ReplayScorer(model, compute_dtype=compute_dtype).score(items, needed).relevance


@pytest.mark.slow
def test_fp16_matmuls_give_the_float32_models_relevance_within_the_goal(
    models: dict[str, Any], replay_items: list[ReplayContexts]
) -> None:
    lengths, real = agreement_rows(replay_items)
    reference = relevance(models["fp32"], replay_items, "fp32")
    fp16 = relevance(models["fp32"], replay_items, "fp16")
    bf16_compute = agreement(reference, relevance(models["bf16"], replay_items, "model"), lengths, real)
    fp16_compute = agreement(reference, fp16, lengths, real)
    print(f"fp16 matmuls: {fp16_compute}\nbf16 compute: {bf16_compute}")
    assert fp16_compute["rows"] > 0
    assert fp16_compute["max_dq"] <= 0.01 and fp16_compute["pearson_min"] >= 0.99
    assert bf16_compute["max_dq"] > 0.01  # the goal is not met by bf16 compute, so this check can fail
    assert (fp16 - reference).abs().max() > 1e-5  # another computation than float32's (the rounding is real)
    # Weights held in bf16 are read as fp16 (exact for bf16 values in range): then the rounding is the weights'.
    from_bf16 = agreement(reference, relevance(models["bf16"], replay_items, "fp16"), lengths, real)
    assert from_bf16["max_dq"] <= 0.02 and from_bf16["pearson_min"] >= 0.99


@pytest.mark.slow
def test_the_fp16_compute_budgets_float32_keys_and_values(models: dict[str, Any]) -> None:
    budget = 1 << 30
    scorer = ReplayScorer(models["bf16"], max_cache_bytes=budget, compute_dtype="fp16")
    assert scorer.max_cache_tokens == budget // cache_bytes_per_token(models["bf16"].config, torch.float32)


def test_auto_is_fp16_on_cuda_and_fp32_elsewhere(
    smollm2: tuple[Any, Any], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mrtpo_verl.config import ReplayConfig, resolve_compute_dtype

    assert ReplayConfig().compute_dtype == "auto"
    assert resolve_compute_dtype("auto", "cuda") == "fp16"
    assert resolve_compute_dtype("auto", "cpu") == "fp32"
    assert [resolve_compute_dtype(name, "cuda") for name in ("fp32", "tf32", "model")] == ["fp32", "tf32", "model"]
    from mrtpo_verl.replay import scorer as scorer_module

    model, _ = smollm2
    monkeypatch.setattr(scorer_module, "_LOGGED_RESOLUTIONS", set())  # as in a fresh process
    with caplog.at_level("INFO", logger="mrtpo_verl.replay.scorer"):
        assert ReplayScorer(model).compute_dtype == "fp32"  # this CPU
        assert ReplayScorer(model).compute_dtype == "fp32"
    said = [record.getMessage() for record in caplog.records if "compute_dtype auto" in record.getMessage()]
    assert said == ["mrtpo replay: compute_dtype auto -> fp32 on cpu"]  # said once, not per scorer


def test_auto_on_cuda_takes_tf32_where_torch_lacks_float32_output_fp16_matmuls(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``auto`` picks on a CUDA device, given the probe's answer (the probe itself needs CUDA: replaced here;
    on this CPU it really reports the missing kernel, see the one-line refusal test above)."""
    from mrtpo_verl.replay import scorer as scorer_module

    cuda = torch.device("cuda", 0)  # a device object only: nothing runs on it
    monkeypatch.setattr(scorer_module, "_LOGGED_RESOLUTIONS", set())  # as in a fresh process
    monkeypatch.setattr(scorer_module, "float32_output_mm_missing", lambda device: None)
    assert scorer_module.compute_dtype_for("auto", cuda) == "fp16"
    monkeypatch.setattr(scorer_module, "float32_output_mm_missing", lambda device: "no kernel")
    with caplog.at_level("INFO", logger="mrtpo_verl.replay.scorer"):
        assert scorer_module.compute_dtype_for("auto", cuda) == "tf32"
    assert any(r.levelname == "WARNING" and "auto -> tf32 on cuda:0 (no fp16" in r.getMessage() for r in caplog.records)
    assert scorer_module.compute_dtype_for("fp16", cuda) == "fp16"  # asked for: refused at its first pass instead
    assert float32_output_mm_missing("cpu") is not None  # this CPU build has no such kernel

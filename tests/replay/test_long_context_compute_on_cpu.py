"""The replay's compute dtypes at long contexts: a response beyond position 4,096 on the real SmolLM2-135M-Instruct.

One real Spider replay (worked Spider examples as the long prompt, three verifier blocks, the reference query as the
response; ``mrtpo_verl.analysis.long_context.long_context_item``) through the public ``ReplayScorer`` in fp16 (emulated:
this CPU has no fp16 unit), tf32 (emulated: ``emulated_products()``) and fp32 under an outer bf16 autocast (as verl's
engine forward sets one), each against the float32 model computed in IEEE float32. The goal the replay is held to is
max |Δq| ≤ 0.01 per row; rounding the rotary embedding's positions to fp16 or TF32 breaks it by far at these positions.
The other bands (near 550, 2,150 and 7,950) are rows of ``python -m benchmarks.replay_numerics``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mrtpo_verl.analysis.agreement import agreement, agreement_rows
from mrtpo_verl.analysis.long_context import long_context_item, long_context_relevance

pytestmark = pytest.mark.slow

#: The response's first position: beyond 4,096, where fp16 keeps only multiples of 4 of a position.
RESPONSE_START = 4250


@pytest.fixture(scope="module")
def long_item(smollm2: tuple[Any, Any]) -> Any:
    _, tokenizer = smollm2
    return long_context_item(tokenizer, RESPONSE_START)


@pytest.fixture(scope="module")
def reference(smollm2: tuple[Any, Any], long_item: Any) -> torch.Tensor:
    model, _ = smollm2
    return long_context_relevance(model, long_item, "reference")


@pytest.mark.parametrize("mode", ["fp16", "tf32 (emulated)"])
def test_reduced_precision_agrees_with_float32_beyond_4k(
    smollm2: tuple[Any, Any], long_item: Any, reference: torch.Tensor, mode: str
) -> None:
    model, _ = smollm2
    assert len(long_item.full_context_ids) > 4096
    relevance = long_context_relevance(model, long_item, mode)
    lengths, real = agreement_rows([long_item])
    figures = agreement(reference, relevance, lengths, real)
    print(f"{mode} at positions {len(long_item.full_context_ids)}+: {figures}")
    assert figures["rows"] == 3
    assert figures["max_dq"] <= 0.01 and figures["pearson_min"] >= 0.99
    assert (relevance - reference).abs().max() > 1e-5  # another computation than float32's: the rounding is there


def test_fp32_is_the_float32_models_relevance_beyond_4k_under_autocast(
    smollm2: tuple[Any, Any], long_item: Any, reference: torch.Tensor
) -> None:
    from mrtpo_verl.replay.scorer import ReplayScorer

    model, _ = smollm2
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        relevance = ReplayScorer(model, compute_dtype="fp32").score([long_item], torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(relevance.relevance, reference, atol=1e-5, rtol=0)

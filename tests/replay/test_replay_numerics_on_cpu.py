"""benchmarks.replay_numerics on the real SmolLM2 and two real Spider replays: the measuring code, not its figures."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from benchmarks.replay_numerics import EXTRA_PADDING, FamilyNumerics, agreement, noise_floor, report
from mrtpo_verl.replay.contexts import ReplayContexts
from mrtpo_verl.replay.model_loading import cast_parameters

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_sequences(replay_items: list[ReplayContexts]) -> tuple[list[list[int]], list[int]]:
    full = [[*item.full_context_ids, *item.response_ids] for item in replay_items]
    return full, [len(item.response_ids) for item in replay_items]


def test_noise_floor_is_tiny_in_float32_and_measured_on_every_response_token(
    smollm2: tuple[Any, Any], full_sequences: tuple[list[list[int]], list[int]]
) -> None:
    model, _ = smollm2
    full, lengths = full_sequences
    noise = noise_floor(model, full, lengths)
    assert set(noise) == {
        "batched, right-padded",
        "batched, left-padded",
        f"alone, +{EXTRA_PADDING} padding",
        "prefix cache (first half)",
    }
    for variant, values in noise.items():
        assert len(values) == sum(lengths), variant
        assert all(0.0 <= v < 1e-4 for v in values), (variant, max(values))


def test_bf16_noise_floor_is_visible(
    smollm2: tuple[Any, Any], full_sequences: tuple[list[list[int]], list[int]]
) -> None:
    """The same context computed two ways in bf16 differs far more than in float32 (rounding of another order)."""
    model, _ = smollm2
    full, lengths = full_sequences
    noise = noise_floor(cast_parameters(copy.deepcopy(model), torch.bfloat16), full, lengths)
    assert max(max(values) for values in noise.values()) > 1e-3


def test_agreement_figures() -> None:
    torch.manual_seed(0)
    reference = torch.rand(2, 3, 10)
    lengths = [10, 6]
    rows = torch.tensor([[True, True, False], [True, False, True]])
    same = agreement(reference, reference.clone(), lengths, rows)
    assert same["rows"] == 4
    assert same["max_dq"] == 0.0 and same["max_dw"] == 0.0 and same["top10_changed"] == 0.0
    assert same["pearson_min"] == pytest.approx(1.0)
    shifted = reference.clone()
    shifted[1, 2, 3] += 0.05  # row (1, 2) is compared: its 4th token moves by 0.05
    shifted[0, 2, 0] += 0.5  # row (0, 2) is not compared (no real leave-one-out context)
    moved = agreement(reference, shifted, lengths, rows)
    assert moved["max_dq"] == pytest.approx(0.05, abs=1e-6)
    assert moved["q_at_max_dq"] == pytest.approx(reference[1, 2, 3].item())


def test_report_lists_every_family_and_variant() -> None:
    family = FamilyNumerics("tool_calling", 2, 10)
    for dtype in ("float32", "bf16"):
        family.noise[dtype] = {"batched, right-padded": [0.0, 1e-3]}
        family.signal[dtype] = [0.1, 0.2]
    family.agreement["bf16"] = agreement(torch.ones(1, 1, 4), torch.ones(1, 1, 4), [4], torch.ones(1, 1).bool())
    family.replay_seconds.update({"float32": 1.0, "bf16": 0.8})
    text = report([family], ["command: test"])
    assert "| tool_calling | bf16 | noise: batched, right-padded |" in text
    assert "| tool_calling | bf16 | 1 |" in text


@pytest.mark.parametrize("start", [550, 4250, 7950])
def test_long_context_items_put_the_response_at_the_band(smollm2: tuple[Any, Any], start: int) -> None:
    """The long-context bands: the response starts at about the asked position (not before it), three real
    leave-one-out contexts, and the whole replay fits the model's 8,192 positions."""
    from benchmarks.replay_numerics import agreement_rows, long_context_item

    model, tokenizer = smollm2
    item = long_context_item(tokenizer, start)
    assert start <= len(item.full_context_ids) <= start + 400
    assert len(item.full_context_ids) + len(item.response_ids) <= model.config.max_position_embeddings
    assert len(item.response_ids) > 50
    _, real = agreement_rows([item])
    assert real.tolist() == [[True, True, True]]


def test_long_context_report_names_the_band_and_mode() -> None:
    from benchmarks.replay_numerics import BandAgreement, long_context_report

    figures = agreement(torch.ones(1, 3, 4), torch.ones(1, 3, 4), [4], torch.ones(1, 3).bool())
    text = long_context_report([BandAgreement(4263, 4412, "fp16", figures, 12.0)])
    assert "| 4263–4412 | fp16 | 3 |" in text

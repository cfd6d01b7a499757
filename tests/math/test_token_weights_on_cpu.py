"""Token weights, the warm-up schedule and the shuffle ablation."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrtpo_verl.math.token_weights import beta_at_step, shuffle_within_responses, smoothstep, token_weights


def test_primer_worked_example() -> None:
    """The primer's q = (0.13, 0.10, 0.07) at β = 0.5.

    Computed exactly, q̄ = 0.10 and w = 0.5 + 0.5 · q / q̄ = (1.15, 1.00, 0.85) with mean 1. The
    primer prints (1.15, 1.05, 0.85): its middle figure comes from an unrounded q₂ ≈ 0.11 that it
    shows as 0.10 (the primer rounds its mean to 1.02); the outer two agree.
    """
    relevance = torch.tensor([[[0.13, 0.10, 0.07]]])
    weights = token_weights(relevance, torch.ones(1, 3), beta=0.5)
    assert torch.allclose(weights, torch.tensor([[[1.15, 1.00, 0.85]]]), atol=1e-6)
    assert float(weights.mean()) == pytest.approx(1.0)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 4),
    rewards=st.integers(1, 3),
    length=st.integers(1, 12),
    beta=st.floats(0.0, 1.0),
    cap=st.one_of(st.none(), st.floats(1.01, 5.0)),
)
def test_mean_weight_over_valid_tokens_is_one(
    data: st.DataObject, batch: int, rewards: int, length: int, beta: float, cap: float | None
) -> None:
    mask_bits = data.draw(st.lists(st.booleans(), min_size=batch * length, max_size=batch * length))
    mask = torch.tensor(mask_bits, dtype=torch.float32).reshape(batch, length)
    mask[:, 0] = 1.0  # every response has at least one token (length-1 responses included)
    values = data.draw(
        st.lists(st.floats(0.0, 1.0), min_size=batch * rewards * length, max_size=batch * rewards * length)
    )
    relevance = torch.tensor(values, dtype=torch.float32).reshape(batch, rewards, length)
    weights = token_weights(relevance, mask, beta=beta, ratio_cap=cap)
    valid = mask.bool().unsqueeze(1).expand_as(weights)
    mean = (weights * valid).sum(-1) / valid.sum(-1)
    assert torch.allclose(mean, torch.ones_like(mean), atol=1e-5)
    assert (weights >= 0).all()
    assert (weights[~valid] == 1).all()


def test_zero_mean_relevance_gives_uniform_weights() -> None:
    relevance = torch.zeros(2, 2, 5)
    relevance[1, 1, 2] = 1e-12  # below the "no relevant token" threshold
    assert torch.equal(token_weights(relevance, torch.ones(2, 5), beta=0.7), torch.ones(2, 2, 5))


def test_padding_does_not_enter_the_mean() -> None:
    relevance = torch.tensor([[[0.2, 0.4, 9.0]]])  # the 9.0 sits on padding
    weights = token_weights(relevance, torch.tensor([[1.0, 1.0, 0.0]]), beta=1.0)
    assert torch.allclose(weights, torch.tensor([[[2 / 3, 4 / 3, 1.0]]]))


def test_ratio_cap_clips_then_renormalises() -> None:
    relevance = torch.tensor([[[0.0, 0.0, 0.0, 1.0]]])  # ρ = (0, 0, 0, 4)
    weights = token_weights(relevance, torch.ones(1, 4), beta=1.0, ratio_cap=2.0)
    # clipped ρ = (0, 0, 0, 2), mean 0.5 → renormalised (0, 0, 0, 4): a lone relevant token keeps all the credit.
    assert torch.allclose(weights, torch.tensor([[[0.0, 0.0, 0.0, 4.0]]]))
    relevance = torch.tensor([[[1.0, 1.0, 4.0, 2.0]]])  # ρ = (0.5, 0.5, 2, 1)
    weights = token_weights(relevance, torch.ones(1, 4), beta=1.0, ratio_cap=1.5)
    clipped = torch.tensor([0.5, 0.5, 1.5, 1.0])
    assert torch.allclose(weights[0, 0], clipped / clipped.mean())


def test_all_padding_response_gets_weight_one() -> None:
    weights = token_weights(torch.rand(2, 1, 3), torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]), beta=0.5)
    assert torch.equal(weights[0], torch.ones(1, 3))


@pytest.mark.parametrize(
    ("relevance", "mask", "beta", "cap", "message"),
    [
        (torch.rand(2, 3), torch.ones(2, 3), 0.5, None, r"\(bs, K, L\)"),
        (torch.rand(2, 1, 3), torch.ones(2, 4), 0.5, None, "does not match"),
        (torch.rand(2, 1, 3), torch.ones(2, 3), 1.5, None, "beta"),
        (torch.rand(2, 1, 3), torch.ones(2, 3), 0.5, 1.0, "ratio_cap"),
        (-torch.rand(2, 1, 3), torch.ones(2, 3), 0.5, None, "finite and ≥ 0"),
        (torch.full((2, 1, 3), float("nan")), torch.ones(2, 3), 0.5, None, "finite"),
        (torch.tensor([[[0.1, float("nan"), 0.2]]]), torch.ones(1, 3), 0.5, None, "finite"),
        (torch.tensor([[[0.1, float("inf"), 0.2]]]), torch.ones(1, 3), 0.5, None, "finite"),
    ],
)
def test_bad_arguments_raise(
    relevance: torch.Tensor, mask: torch.Tensor, beta: float, cap: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        token_weights(relevance, mask, beta=beta, ratio_cap=cap)


def test_warmup_schedule_values() -> None:
    assert beta_at_step(0.5, 10, 0) == 0.0
    assert beta_at_step(0.5, 10, 5) == pytest.approx(0.25)  # smoothstep(½) = ½
    assert beta_at_step(0.5, 10, 10) == 0.5
    assert beta_at_step(0.5, 10, 20) == 0.5
    assert beta_at_step(0.5, 10, 1) == pytest.approx(0.5 * (3 * 0.01 - 2 * 0.001))
    assert beta_at_step(0.3, 0, 0) == 0.3
    assert smoothstep(-1.0) == 0.0 and smoothstep(2.0) == 1.0
    with pytest.raises(ValueError, match="step"):
        beta_at_step(0.5, 10, -1)
    with pytest.raises(ValueError, match="warmup_steps"):
        beta_at_step(0.5, -2, 3)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), length=st.integers(1, 10), batch=st.integers(1, 3))
def test_shuffle_keeps_each_rows_multiset_and_padding(seed: int, length: int, batch: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.rand(batch, 2, length, generator=generator)
    mask = (torch.rand(batch, length, generator=generator) > 0.4).float()
    shuffled = shuffle_within_responses(weights, mask, torch.Generator().manual_seed(seed))
    valid = mask.bool()
    for b in range(batch):
        for k in range(2):
            assert torch.equal(shuffled[b, k][valid[b]].sort().values, weights[b, k][valid[b]].sort().values)
            assert torch.equal(shuffled[b, k][~valid[b]], weights[b, k][~valid[b]])


def test_shuffle_actually_moves_weights() -> None:
    weights = torch.arange(64, dtype=torch.float32).reshape(1, 1, 64)
    shuffled = shuffle_within_responses(weights, torch.ones(1, 64), torch.Generator().manual_seed(0))
    assert not torch.equal(shuffled, weights)


def reference_weights(relevance: torch.Tensor, mask: torch.Tensor, beta: float, cap: float | None) -> torch.Tensor:
    """``w = (1 − β) + β · ρ`` written out of place over fully expanded masks, the formula as read."""
    valid = mask.bool().unsqueeze(1).expand_as(relevance)
    q = torch.where(valid, relevance.float(), 0.0)
    n_valid = valid.sum(dim=-1, keepdim=True)
    mean_q = q.sum(dim=-1, keepdim=True) / n_valid.clamp(min=1)
    informative = mean_q > 1e-8
    ratio = torch.where(valid & informative, q / torch.where(informative, mean_q, 1.0), 1.0)
    if cap is not None:
        clipped = torch.where(valid, ratio.clamp(max=cap), 0.0)
        mean_clipped = clipped.sum(dim=-1, keepdim=True) / n_valid.clamp(min=1)
        ratio = torch.where(valid, clipped / mean_clipped.clamp(min=1e-8), 1.0)
    return torch.where(valid, (1.0 - beta) + beta * ratio, 1.0)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 1.0), st.sampled_from([None, 1.5, 3.0]))
def test_weights_equal_the_out_of_place_formula_bit_for_bit(seed: int, beta: float, cap: float | None) -> None:
    generator = torch.Generator().manual_seed(seed)
    relevance = torch.rand(4, 3, 9, generator=generator) ** 3
    relevance[0, 1] = 0.0  # a reward with no relevant token
    mask = (torch.rand(4, 9, generator=generator) > 0.3).long()
    mask[2] = 0  # a response that is all padding
    before = relevance.clone()
    weights = token_weights(relevance, mask, beta, cap)
    assert torch.equal(weights, reference_weights(relevance, mask, beta, cap))
    assert torch.equal(relevance, before)  # the caller's relevance is read, not written
    assert weights.dtype == torch.float32 and weights.data_ptr() != relevance.data_ptr()

"""From relevance to token weights: MRTPO's reallocation of each reward's credit.

For one response, reward ``k`` and valid tokens ``t`` (``response_mask = 1``):

    q̄_k     = mean_t q_{k,t}
    ρ_{k,t} = q_{k,t} / q̄_k                       (relevance ratio, mean 1)
    w_{k,t} = (1 - β_s) + β_s · ρ_{k,t}           (mean 1, so the reward's total is kept)
    β_s     = β · smoothstep(min(1, s / S)),  smoothstep(u) = 3u² − 2u³

When ``q̄_k`` is (nearly) 0 no token is more relevant than another and ``ρ = 1``. An optional
cap clips ``ρ`` at ``ratio_cap`` and rescales the clipped ratios back to mean 1 (so the cap bounds
how far credit can move, while the reward's total stays unchanged).
Padding positions (``response_mask = 0``) get weight 1; they are masked out downstream.
"""

from __future__ import annotations

import torch

__all__ = ["beta_at_step", "shuffle_within_responses", "smoothstep", "token_weights"]

#: Mean relevance at or below this counts as "no token is relevant" (uniform weights).
MIN_MEAN_RELEVANCE = 1e-8


def smoothstep(u: float) -> float:
    """``3u² − 2u³`` on ``u`` clipped to [0, 1]; 0 → 0, ½ → ½, 1 → 1, flat at both ends."""
    u = min(1.0, max(0.0, u))
    return u * u * (3.0 - 2.0 * u)


def beta_at_step(beta: float, warmup_steps: int, step: int) -> float:
    """Warm-up schedule ``β_s = β · smoothstep(min(1, s / S))``.

    Args:
        beta: final allocation strength β in [0, 1].
        warmup_steps: S ≥ 0; 0 means β from the first step.
        step: the trainer's global step s ≥ 0 (a resumed run passes its restored step).

    Returns:
        β_s in [0, β].
    """
    if step < 0:
        raise ValueError(f"step must be ≥ 0, got {step}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be ≥ 0, got {warmup_steps}")
    if warmup_steps == 0:
        return beta
    return beta * smoothstep(step / warmup_steps)


def _valid_counts(valid: torch.Tensor, rows_at_a_time: int = 64) -> torch.Tensor:
    """(bs, 1, 1) int64 number of valid tokens per response, from (bs, 1, L) bool.

    Counted a block of rows at a time: a bool sum casts its input to int64 first, which for the whole mask
    would be a (bs, L) int64 temporary (8 bytes per token).
    """
    return torch.cat([block.sum(dim=-1, keepdim=True) for block in torch.split(valid, rows_at_a_time)])


def _relevance_ratio_(q: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``ρ = q / q̄`` over valid tokens, 1 where ``q̄ ≈ 0`` and at padding, computed in ``q``'s own memory.

    Args:
        q: (..., L) float32 relevance q ≥ 0, overwritten by the ratio (the caller's own copy).
        valid: (..., 1, L) bool, broadcast over ``q``'s reward dimension (never expanded in memory).

    Returns:
        ``q`` itself, holding the ratio: mean 1 over each row's valid tokens (rows with any).
    """
    q.masked_fill_(~valid, 0.0)
    n_valid = _valid_counts(valid)
    mean_q = q.sum(dim=-1, keepdim=True) / n_valid.clamp(min=1)
    informative = mean_q > MIN_MEAN_RELEVANCE
    q.div_(torch.where(informative, mean_q, 1.0))
    return q.masked_fill_(~informative, 1.0).masked_fill_(~valid, 1.0)


def _cap_ratio_(ratio: torch.Tensor, valid: torch.Tensor, ratio_cap: float) -> torch.Tensor:
    """Clip ρ at ``ratio_cap`` and rescale so its mean over valid tokens is 1 again, in ``ratio``'s memory.

    Args:
        ratio: (..., L) ratio with mean 1 over valid tokens, overwritten.
        valid: (..., 1, L) bool, broadcast over the reward dimension.
        ratio_cap: upper bound > 1 on ρ before rescaling.

    Returns:
        ``ratio`` itself, capped: mean 1 over valid tokens, 1 at padding.
    """
    ratio.clamp_(max=ratio_cap).masked_fill_(~valid, 0.0)
    n_valid = _valid_counts(valid).clamp(min=1)
    mean_clipped = ratio.sum(dim=-1, keepdim=True) / n_valid
    # mean_clipped > 0 whenever a row has a valid token: ρ has mean 1 there and clipping keeps ρ ≥ 0,
    # and it is only 0 when every ρ is 0, which cannot happen with mean 1.
    ratio.div_(mean_clipped.clamp(min=MIN_MEAN_RELEVANCE))
    return ratio.masked_fill_(~valid, 1.0)


def token_weights(
    relevance: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    ratio_cap: float | None = None,
) -> torch.Tensor:
    """Token weights ``w = (1 − β) + β · q / q̄`` per response and reward.

    Memory: the weights are one new (bs, K, L) float32 tensor, computed in place; masks stay (bs, 1, L) and
    (bs, K, 1), and ``relevance`` is read, never written.

    Args:
        relevance: (bs, K, L) relevance q ∈ [0, 1] of each reward at each response token.
        response_mask: (bs, L) 1 at valid response tokens, 0 at padding.
        beta: the step's allocation strength β_s ∈ [0, 1] (see :func:`beta_at_step`).
        ratio_cap: optional bound > 1 on ``q / q̄`` (renormalised after clipping); None = no cap.

    Returns:
        (bs, K, L) float32 weights; over each (response, reward)'s valid tokens their mean is 1.
        Padding gets 1. A response with no valid token gets all 1.
    """
    if relevance.dim() != 3 or response_mask.dim() != 2:
        raise ValueError(
            f"relevance must be (bs, K, L) and response_mask (bs, L); got {tuple(relevance.shape)} "
            f"and {tuple(response_mask.shape)}"
        )
    if relevance.shape[0] != response_mask.shape[0] or relevance.shape[2] != response_mask.shape[1]:
        raise ValueError(
            f"relevance {tuple(relevance.shape)} does not match response_mask {tuple(response_mask.shape)} "
            "in batch size or response length"
        )
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if ratio_cap is not None and not ratio_cap > 1.0:
        raise ValueError(f"ratio_cap must be > 1 (or None for no cap), got {ratio_cap}")
    if relevance.numel():
        smallest, largest = torch.aminmax(relevance)  # NaN propagates into both, failing the test below
        if not (bool(smallest >= 0) and bool(torch.isfinite(largest))):
            raise ValueError("relevance must be finite and ≥ 0 (a Jensen–Shannon distance)")
    valid = response_mask.bool().unsqueeze(1)
    weights = _relevance_ratio_(relevance.to(torch.float32, copy=True), valid)
    if ratio_cap is not None:
        weights = _cap_ratio_(weights, valid, ratio_cap)
    return weights.mul_(beta).add_(1.0 - beta).masked_fill_(~valid, 1.0)


def shuffle_within_responses(
    weights: torch.Tensor, response_mask: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Shuffle ablation: permute each (response, reward)'s weights among its valid tokens.

    Keeps each row's multiset of weights (so its mean and spread) and destroys only *where*
    the weights sit, which is what the paper's Table 5 ablation tests.

    Args:
        weights: (bs, K, L) token weights.
        response_mask: (bs, L) valid-token mask.
        generator: optional torch generator for a reproducible permutation.

    Returns:
        (bs, K, L) permuted weights; padding positions unchanged.
    """
    valid = response_mask.bool().unsqueeze(1).expand_as(weights)
    positions = torch.arange(weights.shape[-1], device=weights.device).expand_as(weights).float()
    random_keys = torch.rand(weights.shape, generator=generator, device=weights.device)
    # Both sorts put the valid positions first: in index order (targets) and in random order (sources).
    targets = torch.argsort(torch.where(valid, positions, float("inf")), dim=-1)
    sources = torch.argsort(torch.where(valid, random_keys, float("inf")), dim=-1)
    shuffled = torch.empty_like(weights).scatter_(-1, targets, weights.gather(-1, sources))
    return torch.where(valid, shuffled, weights)

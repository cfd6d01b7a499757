"""Token advantages from per-reward group advantages and token weights.

    A_t^(j) = Σ_k c_k · w_{k,t}^(j) · Â_k^(j)

followed by batch whitening with the statistics of the *uniform* sum ``Σ_k c_k · Â_k^(j)``
with every weight 1 the result is GDPO's, bit for bit.
"""

from __future__ import annotations

import torch

__all__ = ["WHITEN_EPS", "weighted_token_advantage", "whiten_with_statistics"]

#: The variance floor inside verl 0.9.1's ``verl.utils.torch_functional.masked_whiten``.
WHITEN_EPS = 1e-8


def weighted_token_advantage(
    reward_advantages: torch.Tensor,
    weights: torch.Tensor | None,
    reward_weights: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """``Σ_k c_k · w_{k,t} · Â_k`` masked to valid tokens.

    The sum runs over ``k`` in order, one reward at a time, exactly as verl's ``gdpo`` adds its
    per-reward terms: with ``weights`` all 1 the floating-point result is identical to GDPO's sum.

    Args:
        reward_advantages: (bs, K) group-normalised advantage Â_k of each response and reward.
        weights: (bs, K, L) token weights w_{k,t}, or None for uniform weights (GDPO).
        reward_weights: (K,) reward weights c_k.
        response_mask: (bs, L) valid-token mask.

    Returns:
        (bs, L) float32 token advantages, 0 at padding.
    """
    n_rewards = reward_advantages.shape[1]
    if reward_weights.shape != (n_rewards,):
        raise ValueError(f"reward_weights must be ({n_rewards},), got {tuple(reward_weights.shape)}")
    mask = response_mask.to(reward_advantages.dtype)
    total: torch.Tensor | None = None
    for k in range(n_rewards):
        per_token = reward_advantages[:, k : k + 1] * mask
        if weights is not None:
            per_token = per_token * weights[:, k, :]
        term = reward_weights[k] * per_token
        total = term if total is None else total + term
    if total is None:
        raise ValueError("at least one reward is needed")
    return total


def whiten_with_statistics(values: torch.Tensor, mean: torch.Tensor, variance: torch.Tensor) -> torch.Tensor:
    """``(values − mean) · rsqrt(variance + 1e-8)``: verl's whitening formula with given statistics.

    Same expression as ``masked_whiten`` in verl 0.9.1 (``verl/utils/torch_functional.py``) but the
    statistics are passed in, so MRTPO's token advantages are whitened with GDPO's uniform-sum
    statistics. ``tests/test_compat_contract_on_cpu.py`` checks that this equals verl's function.

    Args:
        values: (bs, L) token advantages.
        mean: () masked mean of the reference (uniform) advantages.
        variance: () masked unbiased variance of the reference advantages.

    Returns:
        (bs, L) whitened values.
    """
    return (values - mean) * torch.rsqrt(variance + WHITEN_EPS)

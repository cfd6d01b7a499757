"""Token advantages from per-reward group advantages and token weights.

    A_t^(j) = Σ_k c_k · w_{k,t}^(j) · Â_k^(j)

followed by batch whitening with the statistics of the *uniform* sum ``Σ_k c_k · Â_k^(j)``
with every weight 1 the result is GDPO's, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = [
    "BLOCK_BYTES",
    "WHITEN_EPS",
    "rows_per_block",
    "uniform_statistics",
    "weighted_token_advantage",
    "whiten_with_statistics",
]

#: The variance floor inside verl 0.9.1's ``verl.utils.torch_functional.masked_whiten``.
WHITEN_EPS = 1e-8
#: The denominator floor inside verl 0.9.1's ``verl.utils.torch_functional.masked_mean``.
MEAN_EPS = 1e-8
#: Bytes of one (rows, L) float32 block where the driver works a block of rows at a time (no whole-batch temporaries).
BLOCK_BYTES = 256 * 1024


def rows_per_block(length: int) -> int:
    """Rows of a (bs, L) float32 tensor in :data:`BLOCK_BYTES` (at least 1): 16 at L = 4096."""
    return max(1, BLOCK_BYTES // (4 * max(1, length)))


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


def uniform_statistics(
    reward_advantages: torch.Tensor,
    reward_weights: torch.Tensor,
    response_mask: torch.Tensor,
    rows_at_a_time: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked mean and unbiased masked variance of the uniform sum ``U = Σ_k c_k · Â_k`` (bs, L), block by block.

    The formulas of verl 0.9.1's ``masked_mean`` and ``masked_var`` (``verl/utils/torch_functional.py``)::

        mean     = Σ U·m / (Σ m + 1e-8)
        variance = Σ (U − mean)²·m / (Σ m + 1e-8) · Σ m / (Σ m − 1)

    with ``U`` (from :func:`weighted_token_advantage`), ``U − mean`` and its square made in float32 exactly as
    there, but ``rows_at_a_time`` rows at a time and the sums accumulated in float64, so no (bs, L) tensor is
    made. The results differ from verl's float32 whole-tensor sums only by those sums' rounding.

    Args:
        reward_advantages: (bs, K) group-normalised advantages Â_k.
        reward_weights: (K,) reward weights c_k.
        response_mask: (bs, L) valid-token mask.
        rows_at_a_time: rows per block (≥ 1); None for :func:`rows_per_block` of L.

    Returns:
        (mean, variance): 0-dim float32 tensors.

    Raises:
        ValueError: fewer than two valid tokens (the unbiased variance is undefined), or ``rows_at_a_time < 1``.
    """
    if rows_at_a_time is None:
        rows_at_a_time = rows_per_block(response_mask.shape[-1])
    if rows_at_a_time < 1:
        raise ValueError(f"rows_at_a_time must be ≥ 1, got {rows_at_a_time}")
    blocks = range(0, response_mask.shape[0], rows_at_a_time)
    # Summed block by block: a sum with a dtype, or of a bool mask, first casts the whole mask to that dtype.
    count = sum(float(response_mask[start : start + rows_at_a_time].sum()) for start in blocks)
    if count < 2:
        raise ValueError(f"the masked variance needs at least two valid tokens; the mask sums to {count:g}")

    def masked_total(values_of: Callable[[slice], torch.Tensor]) -> float:
        total = 0.0
        for start in blocks:
            rows = slice(start, start + rows_at_a_time)
            mask = response_mask[rows]
            values = torch.where(mask.bool(), values_of(rows), 0.0)
            total += float((values * mask).sum(dtype=torch.float64))
        return total

    def uniform(rows: slice) -> torch.Tensor:
        return weighted_token_advantage(reward_advantages[rows], None, reward_weights, response_mask[rows])

    device = response_mask.device
    mean = torch.tensor(masked_total(uniform) / (count + MEAN_EPS), dtype=torch.float32, device=device)
    centered_square_total = masked_total(lambda rows: (uniform(rows) - mean) ** 2)
    variance = centered_square_total / (count + MEAN_EPS) * (count / (count - 1))
    return mean, torch.tensor(variance, dtype=torch.float32, device=device)


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

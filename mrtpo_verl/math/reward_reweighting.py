"""Optional response-level reward reweighting that composes with MRTPO.

``saw`` (ours, after the SAW idea of weighting rewards by their batch coefficient of variation):

    cv_k = std_batch(r_k) / (|mean_batch(r_k)| + ε),     s_k = K · cv_k / Σ_i cv_i
    c'_k = c_k · s_k

so rewards that still vary across the batch get more weight, the scales average to 1, and a
batch where no reward varies keeps ``c``. It changes only the scalar ``c_k``; where each
reward's credit lands inside a response is still MRTPO's token weights.
"""

from __future__ import annotations

import torch

__all__ = ["saw_reward_weights"]


def saw_reward_weights(rewards: torch.Tensor, reward_weights: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Scale reward weights by each reward's batch coefficient of variation.

    Args:
        rewards: (bs, K) raw reward values of the batch.
        reward_weights: (K,) base weights c_k.
        eps: floor on |mean| so a zero-mean reward gives a large but finite cv.

    Returns:
        (K,) float32 weights c'_k; equal to ``reward_weights`` when no reward varies.
    """
    if rewards.dim() != 2 or rewards.shape[1] != reward_weights.shape[0]:
        raise ValueError(f"rewards must be (bs, K) with K = {reward_weights.shape[0]}, got {tuple(rewards.shape)}")
    values = rewards.float()
    spread = values.std(dim=0, unbiased=False)
    cv = spread / (values.mean(dim=0).abs() + eps)
    total = cv.sum()
    if not bool(total > 0):
        return reward_weights.float().clone()
    scale = cv.shape[0] * cv / total
    return reward_weights.float() * scale

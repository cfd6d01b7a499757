"""Per-step MRTPO figures for verl's tracking (and the Ray dashboard's metrics)."""

from __future__ import annotations

import torch

__all__ = ["relevance_metrics", "top_share"]

#: The share of tokens whose relevance share is reported: uniform relevance gives exactly this.
TOP_FRACTION = 0.10


def top_share(relevance: torch.Tensor, valid: torch.Tensor, fraction: float = TOP_FRACTION) -> torch.Tensor:
    """Share of each row's total relevance held by its top ``fraction`` of valid tokens.

    Args:
        relevance: (rows, L) relevance ≥ 0.
        valid: (rows, L) bool.
        fraction: top share of tokens, e.g. 0.1.

    Returns:
        (rows,) share in [0, 1]; NaN for rows with no relevance (nothing to share).
    """
    q = torch.where(valid, relevance, 0.0)
    n_top = torch.clamp((valid.sum(-1).float() * fraction).ceil().long(), min=1)
    ranked = q.sort(dim=-1, descending=True).values
    cumulative = ranked.cumsum(dim=-1)
    top = cumulative.gather(-1, (n_top - 1).unsqueeze(-1)).squeeze(-1)
    total = cumulative[:, -1]
    return torch.where(total > 0, top / total.clamp(min=1e-12), torch.nan)


def relevance_metrics(
    relevance: torch.Tensor, response_mask: torch.Tensor, needed: torch.Tensor, reward_keys: tuple[str, ...]
) -> dict[str, float]:
    """Per reward: mean relevance and the top-10% share over the replayed responses.

    Args:
        relevance: (bs, K, L).
        response_mask: (bs, L).
        needed: (bs, K) bool, the pairs that were replayed.
        reward_keys: names of the K rewards.
    """
    valid = response_mask.bool()
    metrics: dict[str, float] = {}
    for k, key in enumerate(reward_keys):
        rows = needed[:, k]
        if not bool(rows.any()):
            continue
        q, v = relevance[rows, k], valid[rows]
        metrics[f"mrtpo/{key}/relevance_mean"] = float(q[v].mean()) if bool(v.any()) else 0.0
        shares = top_share(q, v)
        shares = shares[~torch.isnan(shares)]
        if shares.numel():
            metrics[f"mrtpo/{key}/relevance_top10_share"] = float(shares.mean())
    return metrics

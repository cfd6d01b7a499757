"""Per-step MRTPO figures for verl's tracking (and the Ray dashboard's metrics)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["relevance_metrics", "reward_component_metrics", "staleness_metrics", "top_share"]

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


#: Rows of the relevance tensor read at a time for the metrics (the driver never copies all of it).
METRIC_ROW_BLOCK = 64


def relevance_metrics(
    relevance: torch.Tensor, response_mask: torch.Tensor, needed: torch.Tensor, reward_keys: tuple[str, ...]
) -> dict[str, float]:
    """Per reward: mean relevance and the top-10% share over the replayed responses.

    Read :data:`METRIC_ROW_BLOCK` rows at a time, so the extra memory is a few (block, L) tensors.

    Args:
        relevance: (bs, K, L).
        response_mask: (bs, L).
        needed: (bs, K) bool, the pairs that were replayed.
        reward_keys: names of the K rewards.
    """
    metrics: dict[str, float] = {}
    for k, key in enumerate(reward_keys):
        rows = torch.nonzero(needed[:, k]).flatten()
        if rows.numel() == 0:
            continue
        total, count, share_sum, share_count = 0.0, 0, 0.0, 0
        for block in rows.split(METRIC_ROW_BLOCK):
            q, v = relevance[block, k], response_mask[block].bool()
            total += float(torch.where(v, q, 0.0).sum(dtype=torch.float64))
            count += int(v.sum())
            shares = top_share(q, v)
            kept = shares[~torch.isnan(shares)]
            share_sum += float(kept.sum(dtype=torch.float64))
            share_count += kept.numel()
        metrics[f"mrtpo/{key}/relevance_mean"] = total / count if count else 0.0
        if share_count:
            metrics[f"mrtpo/{key}/relevance_top10_share"] = share_sum / share_count
    return metrics


def reward_component_metrics(
    rewards: torch.Tensor, index: np.ndarray, reward_keys: tuple[str, ...]
) -> dict[str, float]:
    """Per reward: ``reward/<key>/mean|std|min|max`` over the responses, and the zero-variance group share.

    verl's v1 trainer logs reward components only at validation; these are the training batch's.
    ``reward/<key>/zero_variance_group_share`` is the share of prompt groups in which reward k is
    constant: there ``Â_k = 0`` and the reward carries no signal this step (nor needs a replay).

    Args:
        rewards: (bs, K) reward components of the batch's real (non-padding) responses.
        index: (bs,) group id (uid) per response.
        reward_keys: names of the K rewards.
    """
    if rewards.shape[0] == 0:
        return {}
    groups = [np.flatnonzero(index == uid) for uid in dict.fromkeys(index.tolist())]
    metrics: dict[str, float] = {}
    for k, key in enumerate(reward_keys):
        column = rewards[:, k].double()
        constant = sum(1 for rows in groups if bool((column[rows] == column[rows[0]]).all()))
        metrics[f"reward/{key}/mean"] = float(column.mean())
        metrics[f"reward/{key}/std"] = float(column.std(unbiased=False))
        metrics[f"reward/{key}/min"] = float(column.min())
        metrics[f"reward/{key}/max"] = float(column.max())
        metrics[f"reward/{key}/zero_variance_group_share"] = constant / len(groups)
    return metrics


def staleness_metrics(tags: Sequence[dict], global_step: int) -> dict[str, float]:
    """verl's trajectory staleness of the batch, ``(global_step - 1) - max_global_steps`` per response.

    The same figure verl's ``_compute_metrics`` logs as ``training/off_policy/trajectory_staleness``
    (how many weight versions a response lags the policy being trained), reported here next to the
    relevance so that the Ray dashboard shows the two together. Rows without the tag (padding) are skipped.
    """
    versions = [tag["max_global_steps"] for tag in tags if tag.get("max_global_steps") is not None]
    if not versions:
        return {}
    staleness = np.asarray([(global_step - 1) - int(v) for v in versions], dtype=np.float64)
    return {"mrtpo/staleness/mean": float(staleness.mean()), "mrtpo/staleness/max": float(staleness.max())}

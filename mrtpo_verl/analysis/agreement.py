"""Agreement of two relevance tensors: how far one replay's ``q`` (bs, K, L) lies from a reference's.

Figures over the (response, reward) rows with a real leave-one-out context, each row cut to its response
length: Pearson correlation, max |Δq|, max |Δw| of the token weights at β (:func:`mrtpo_verl.math.token_weights`),
the share of rows whose top-10% token set changes, and the reference ``q`` where |Δq| is largest.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from mrtpo_verl.math.token_weights import token_weights

__all__ = ["BETA", "agreement", "agreement_rows"]

#: Allocation strength β at which the token weights are compared (the paper's default).
BETA = 0.5


def _row_agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float, float, bool, float]:
    """(pearson, max |Δq|, max |Δw| at β, top-10% set changed, reference q where |Δq| is largest) of one row."""
    gap = (reference - other).abs()
    dq = gap.max().item()
    q_at_max = reference[gap.argmax()].item()
    valid = torch.ones(1, reference.numel())
    w_r, w_o = (token_weights(q.reshape(1, 1, -1), valid, BETA)[0, 0] for q in (reference, other))
    dw = (w_r - w_o).abs().max().item()
    if reference.numel() > 1 and reference.std() > 0 and other.std() > 0:
        pearson = torch.corrcoef(torch.stack([reference, other]))[0, 1].item()
    else:
        pearson = 1.0 if torch.equal(reference, other) else float("nan")
    top = max(1, math.ceil(0.1 * reference.numel()))
    changed = set(reference.topk(top).indices.tolist()) != set(other.topk(top).indices.tolist())
    return pearson, dq, dw, changed, q_at_max


def agreement_rows(items: Sequence[Any]) -> tuple[list[int], torch.Tensor]:
    """For replay contexts: (each response's length, (bs, K) bool: True where reward k's leave-one-out context
    differs from the full one), the ``lengths`` and ``rows`` :func:`agreement` takes."""
    lengths = [len(item.response_ids) for item in items]
    real = torch.tensor(
        [[list(loo) != list(item.full_context_ids) for loo in item.leave_one_out_ids] for item in items]
    )
    return lengths, real


def agreement(
    reference: torch.Tensor, other: torch.Tensor, lengths: Sequence[int], rows: torch.Tensor
) -> dict[str, float]:
    """Agreement figures over the (response, k) rows where ``rows`` is True (a real leave-one-out context).

    Returns:
        ``rows`` (count), ``pearson_min``, ``pearson_median``, ``max_dq``, ``max_dw``, ``top10_changed`` (share of
        rows), ``q_at_max_dq``.
    """
    pearsons, dqs, dws, changed = [], [], [], 0
    count, q_at_max = 0, float("nan")
    for i, length in enumerate(lengths):
        for k in range(reference.shape[1]):
            if not rows[i, k] or length < 2:
                continue
            p, dq, dw, moved, q_at = _row_agreement(reference[i, k, :length], other[i, k, :length])
            if dq >= max(dqs, default=-1.0):
                q_at_max = q_at
            count += 1
            pearsons.append(p)
            dqs.append(dq)
            dws.append(dw)
            changed += moved
    finite = [p for p in pearsons if not math.isnan(p)]
    return {
        "rows": count,
        "pearson_min": min(finite) if finite else float("nan"),
        "pearson_median": statistics.median(finite) if finite else float("nan"),
        "max_dq": max(dqs, default=0.0),
        "max_dw": max(dws, default=0.0),
        "top10_changed": changed / count if count else 0.0,
        "q_at_max_dq": q_at_max,
    }

"""Per-token relevance: the Jensen–Shannon distance between two next-token distributions.

MRTPO compares, at every response position ``t``, the policy's next-token distribution under
the full verifier context ``P = p(. | C, y_<t)`` with the one under a leave-one-out context
``Q = p(. | C_-k, y_<t)``:

    JSD(P || Q) = ½ KL(P || M) + ½ KL(Q || M),   M = ½ (P + Q)
    q_{k,t}     = sqrt(JSD_2(P || Q)) ∈ [0, 1]   (log base 2, so the distance is bounded by 1)

Each KL term is computed as ``−Σ_v p_v · log1p((q_v − p_v) / 2p_v)`` because
``m / p = (p + q) / 2p = 1 + (q − p) / 2p``: this keeps full relative precision when the two
distributions are close (where the distance is most sensitive, via the square root), gives exactly
0 for identical rows, and treats a vocabulary entry with ``p_v = 0`` (``-inf`` logit) as
contributing nothing, as the definition requires.
"""

from __future__ import annotations

import math

import torch

__all__ = ["js_distance"]

_LN2 = math.log(2.0)
_FLOAT32_MAX = torch.finfo(torch.float32).max


def _kl_term_to_midpoint(weight: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """Per-entry ``a · ln(a / m)`` with ``m = (a + b) / 2``, written as ``−a · log1p((b − a) / 2a)``.

    The ratio ``(b − a) / 2a`` lies in [−½, ∞): it is exactly 0 when ``a = b`` (identical rows give
    exactly 0), small and accurate when the distributions are close, and merely large (never
    −1, never a cancellation) when ``a ≪ b``. It is clamped to the float32 maximum so that a
    denormal ``a`` gives a negligible finite term instead of ``a · inf``.

    Args:
        weight: (rows, vocab) probabilities ``a`` ≥ 0.
        other: (rows, vocab) probabilities ``b`` ≥ 0.

    Returns:
        (rows, vocab) terms, 0 wherever ``a`` is 0 (the ``0 · log 0 = 0`` convention).
    """
    ratio = ((other - weight) / (2.0 * weight)).clamp(max=_FLOAT32_MAX)
    return torch.where(weight > 0, -weight * torch.log1p(ratio), torch.zeros_like(weight))


def _js_divergence_bits_rows(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """JSD (base 2) between two blocks of rows, accumulated in float32.

    Args:
        logits_p: (rows, vocab) logits of P, any float dtype.
        logits_q: (rows, vocab) logits of Q, same shape.

    Returns:
        (rows,) float32 divergence in [0, 1] (NaN for a row that is not a distribution).
    """
    p = torch.softmax(logits_p.float(), dim=-1)
    q = torch.softmax(logits_q.float(), dim=-1)
    per_entry = _kl_term_to_midpoint(p, q) + _kl_term_to_midpoint(q, p)
    return (0.5 / _LN2) * per_entry.sum(dim=-1)


def js_distance(logits_p: torch.Tensor, logits_q: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Jensen–Shannon distance (log base 2) between two next-token distributions.

    ``q_t = sqrt(½ KL(P_t || M_t) + ½ KL(Q_t || M_t))`` with ``M_t = ½ (P_t + Q_t)`` and
    ``P_t = softmax(logits_p[t])``, ``Q_t = softmax(logits_q[t])``. Reduction is in float32
    whatever the input dtype (bf16 logits from a GPU forward pass are upcast a chunk at a time).

    Args:
        logits_p: (n_tokens, vocab) logits under the full verifier context.
        logits_q: (n_tokens, vocab) logits under the leave-one-out context.
        chunk: rows reduced at a time; peak extra memory is O(chunk * vocab) float32.

    Returns:
        (n_tokens,) float32 distance in [0, 1]; exactly 0 for identical rows.

    Raises:
        ValueError: on mismatched shapes, a non-positive chunk, or a row that is not a
            distribution (NaN, +inf, or all entries -inf).
    """
    if logits_p.shape != logits_q.shape or logits_p.dim() != 2:
        raise ValueError(
            f"js_distance expects two (n_tokens, vocab) tensors of one shape, got "
            f"{tuple(logits_p.shape)} and {tuple(logits_q.shape)}"
        )
    if chunk <= 0:
        raise ValueError(f"chunk must be a positive number of rows, got {chunk}")
    n_tokens = logits_p.shape[0]
    distance = torch.empty(n_tokens, dtype=torch.float32, device=logits_p.device)
    for start in range(0, n_tokens, chunk):
        rows = slice(start, start + chunk)
        divergence = _js_divergence_bits_rows(logits_p[rows], logits_q[rows])
        # A NaN here means a row was not a distribution (NaN or +inf logit, or all -inf): checking
        # the (rows,) result costs nothing, unlike a separate pass over the (rows, vocab) logits.
        bad = torch.isnan(divergence)
        if bool(bad.any()):
            first = (bad.nonzero().flatten()[:5] + start).tolist()
            raise ValueError(
                f"js_distance: token rows {first} have no valid distribution (a NaN or +inf logit, or "
                "every logit -inf); mask vocabulary entries with -inf but keep one finite logit per row"
            )
        # Rounding can leave a divergence a hair outside [0, 1]; the distance is defined on it.
        distance[rows] = divergence.clamp_(0.0, 1.0).sqrt_()
    return distance

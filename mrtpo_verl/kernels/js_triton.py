"""Fused Jensen–Shannon divergence kernel (Triton): one program per token row, two passes over the vocabulary.

Pass 1 reads both logit rows once and keeps, per lane, an online maximum and a rescaled sum of
exponentials for P and for Q; their combination gives the two log-normalisers
``lse = max + log Σ exp(z − max)``. Pass 2 reads both rows again and accumulates, in float32,

    −Σ_v [ p_v · log1p((q_v − p_v) / 2p_v) + q_v · log1p((p_v − q_v) / 2q_v) ]  =  KL(P‖M) + KL(Q‖M)

with ``p_v = exp(z_v − lse_P)`` — the same cancellation-free form as the torch path
(:mod:`mrtpo_verl.math.relevance`). Nothing of size ``(rows, vocab)`` is written: the kernel reads
``2 · 2 · n · V`` elements (two passes over two inputs) and writes ``n`` floats.

Numerics:
- ``log1p`` is a short ``2·atanh(x / (2 + x))`` series for ``x ≤ 1`` (relative error ~1e-8 for
  ``x ≥ −½``, the whole range the ratio can take), and ``log(1 + x)`` beyond, where the value is
  ≥ ln 2 and the hardware log's small relative error is harmless. This does not rely on
  ``tl.log`` being accurate near 1 (it may be the approximate ``lg2``).
- A row with a NaN or +inf logit, or with every logit -inf, yields NaN (the caller raises):
  NaNs are flagged explicitly because a hardware max may drop them.
- Identical rows go through identical instructions, so ``q − p`` is exactly 0 and so is the row.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["js_divergence_bits"]

_TINY = 1e-30  # as in the torch path: keeps (q − p) / 2p finite for p = 0, where the term is exactly 0
_HALF_OVER_LN2 = 0.5 / math.log(2.0)


@triton.jit
def _log1p(x):
    """log(1 + x) for x ≥ −½, accurate to a few float32 ulps relative, including near 0."""
    t = x / (2.0 + x)  # |t| ≤ 1/3 for −½ ≤ x ≤ 1
    t2 = t * t
    # 2·atanh(t) = 2t·Σ t^(2k) / (2k + 1); seven terms leave a relative error below (1/9)^7 / 15 ≈ 1.4e-8.
    series = 1.0 / 13.0
    series = series * t2 + 1.0 / 11.0
    series = series * t2 + 1.0 / 9.0
    series = series * t2 + 1.0 / 7.0
    series = series * t2 + 1.0 / 5.0
    series = series * t2 + 1.0 / 3.0
    series = series * t2 + 1.0
    return tl.where(x <= 1.0, 2.0 * t * series, tl.log(1.0 + x))


@triton.jit
def _js_rows_kernel(
    p_ptr,
    q_ptr,
    out_ptr,
    vocab,
    stride_p,
    stride_q,
    TINY: tl.constexpr,
    SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    p_row = p_ptr + row * stride_p
    q_row = q_ptr + row * stride_q
    lanes = tl.arange(0, BLOCK)
    neg_inf = float("-inf")

    # Pass 1: per-lane online max and rescaled sum of exp for both rows.
    max_p = tl.full([BLOCK], neg_inf, tl.float32)
    max_q = tl.full([BLOCK], neg_inf, tl.float32)
    sum_p = tl.zeros([BLOCK], tl.float32)
    sum_q = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab, BLOCK):
        idx = start + lanes
        inside = idx < vocab
        zp = tl.load(p_row + idx, mask=inside, other=neg_inf).to(tl.float32)
        zq = tl.load(q_row + idx, mask=inside, other=neg_inf).to(tl.float32)
        invalid = (zp != zp) | (zq != zq) | (zp == float("inf")) | (zq == float("inf"))
        bad = bad | invalid.to(tl.int32)
        new_p = tl.maximum(max_p, zp)
        new_q = tl.maximum(max_q, zq)
        # A lane that has seen only -inf keeps sum 0 (avoid exp(-inf - -inf) = NaN).
        ref_p = tl.where(new_p == neg_inf, 0.0, new_p)
        ref_q = tl.where(new_q == neg_inf, 0.0, new_q)
        sum_p = sum_p * tl.exp(max_p - ref_p) + tl.exp(zp - ref_p)
        sum_q = sum_q * tl.exp(max_q - ref_q) + tl.exp(zq - ref_q)
        max_p = new_p
        max_q = new_q
    row_max_p = tl.max(max_p, axis=0)
    row_max_q = tl.max(max_q, axis=0)
    lse_p = row_max_p + tl.log(tl.sum(sum_p * tl.exp(max_p - row_max_p), axis=0))
    lse_q = row_max_q + tl.log(tl.sum(sum_q * tl.exp(max_q - row_max_q), axis=0))
    row_bad = (tl.max(bad, axis=0) > 0) | (row_max_p == neg_inf) | (row_max_q == neg_inf)

    # Pass 2: the per-entry KL terms to the midpoint, accumulated per lane in float32.
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + lanes
        inside = idx < vocab
        zp = tl.load(p_row + idx, mask=inside, other=neg_inf).to(tl.float32)
        zq = tl.load(q_row + idx, mask=inside, other=neg_inf).to(tl.float32)
        p = tl.exp(zp - lse_p)
        q = tl.exp(zq - lse_q)
        difference = q - p
        acc += p * _log1p(difference / (2.0 * p + TINY)) + q * _log1p(-difference / (2.0 * q + TINY))
    divergence = -tl.sum(acc, axis=0) * SCALE
    tl.store(out_ptr + row, tl.where(row_bad, float("nan"), divergence))


def _block_size(vocab: int) -> tuple[int, int]:
    """(BLOCK, num_warps): 4096 lanes (16 per thread with 8 warps) for LLM vocabularies."""
    block = min(4096, max(128, triton.next_power_of_2(vocab)))
    return block, 8 if block >= 2048 else 4


def js_divergence_bits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """(n_tokens,) float32 JSD in bits between the rows of two (n_tokens, vocab) logit tensors, NaN for bad rows."""
    if logits_p.shape != logits_q.shape or logits_p.dim() != 2:
        raise ValueError(f"expected two (n_tokens, vocab) tensors of one shape, got {logits_p.shape}, {logits_q.shape}")
    if logits_p.device != logits_q.device:
        raise ValueError(f"logits on different devices: {logits_p.device} and {logits_q.device}")
    n_tokens, vocab = logits_p.shape
    out = torch.empty(n_tokens, dtype=torch.float32, device=logits_p.device)
    if n_tokens == 0:
        return out
    # The kernel walks each row with unit stride; rows may be strided (e.g. a slice of a bigger buffer).
    if logits_p.stride(-1) != 1:
        logits_p = logits_p.contiguous()
    if logits_q.stride(-1) != 1:
        logits_q = logits_q.contiguous()
    block, num_warps = _block_size(vocab)
    _js_rows_kernel[(n_tokens,)](
        logits_p,
        logits_q,
        out,
        vocab,
        logits_p.stride(0),
        logits_q.stride(0),
        TINY=_TINY,
        SCALE=_HALF_OVER_LN2,
        BLOCK=block,
        num_warps=num_warps,
    )
    return out

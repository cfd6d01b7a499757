"""Fused Jensen–Shannon divergence kernel (Triton): one program per token row, two passes over the vocabulary.

Pass 1 reads both logit rows once and keeps, per lane, an online maximum and a rescaled sum of
exponentials for P and for Q (one exp per entry: the sum is rescaled only when a lane meets a new
maximum). Pass 2 reads both rows again, forms ``log p_v = (z_v − max) − log Σ`` and ``p_v = exp(log p_v)``,
and accumulates in float32 the same cancellation-free per-entry form as the torch path
(:mod:`mrtpo_verl.math.relevance`):

    Σ_v [ −p_v · log1p((q_v − p_v) / 2p_v) − q_v · log1p((p_v − q_v) / 2q_v) ]  =  KL(P‖M) + KL(Q‖M)

Nothing of size ``(rows, vocab)`` is written: the kernel reads ``2 · 2 · n · V`` elements (two passes
over two inputs) and writes ``n`` floats.

Numerics (written for the GPU's approximate ``exp``/``log``/division, checked on CPU by Triton's
interpreter and on a GPU by ``python -m benchmarks.gpu_check``):
- ``log1p(x)`` with ``x = (q − p) / 2p ≥ −½`` is ``2·atanh(t)``, ``t = x / (2 + x) = (q − p) / (3p + q)``:
  a seven-term odd series for ``t ≤ 1/3`` (``x ≤ 1``; relative error < 1.4e-8, full precision near
  0, where the distance is most sensitive), and ``log(p + q) − log 2 − log p`` beyond (the value is
  ≥ ln 2, so the approximate hardware log's absolute error of ~1e-7 is harmless). One division and,
  for the pair, one log per entry — the special-function unit, not only memory, bounds this kernel.
- A row with a NaN or +inf logit, or with every logit -inf, yields NaN (the caller raises): NaNs are
  flagged explicitly because a hardware max may drop them.
- Identical rows go through identical instructions, so ``q − p`` is exactly 0 and so is the row.
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl

__all__ = ["js_divergence_bits"]

_TINY = 1e-30  # as in the torch path: keeps (q − p) / 2p finite for p = 0, where the term is exactly 0
_HALF_OVER_LN2 = 0.5 / math.log(2.0)


@triton.jit
def _atanh_series(t):
    """2·atanh(t) = log((1 + t) / (1 − t)) for |t| ≤ 1/3: 2t·Σ t^(2k) / (2k + 1), seven terms (rel. error < 1.4e-8)."""
    t2 = t * t
    series = 1.0 / 13.0
    series = series * t2 + 1.0 / 11.0
    series = series * t2 + 1.0 / 9.0
    series = series * t2 + 1.0 / 7.0
    series = series * t2 + 1.0 / 5.0
    series = series * t2 + 1.0 / 3.0
    series = series * t2 + 1.0
    return 2.0 * t * series


@triton.jit
def _online_update(running_max, running_sum, z):
    """Per-lane online log-sum-exp step with one exp: rescale the sum only when the new value is a new max."""
    gap = tl.where(z == float("-inf"), float("-inf"), z - running_max)  # -inf - -inf would be NaN
    e = tl.exp(-tl.abs(gap))
    new_sum = tl.where(gap > 0.0, running_sum * e + 1.0, running_sum + e)
    return tl.maximum(running_max, z), new_sum


@triton.jit
def _kl_term_to_midpoint(a, b, log_a, log_sum, TINY: tl.constexpr):
    """Per entry ``−a · log1p((b − a) / 2a)`` = ``a · log(2a / (a + b))``, 0 where ``a = 0``.

    With ``x = (b − a) / 2a`` and ``t = x / (2 + x) = (b − a) / (3a + b)``, ``log1p(x) = 2·atanh(t)``:
    for ``x ≤ 1`` (``t ≤ 1/3``) the series keeps full relative precision near 0 with one division;
    beyond, ``log1p(x) = log(a + b) − log 2 − log a`` with ``log a`` taken from the logits (no
    cancellation there: the entry is far from the midpoint). ``x ≥ −½`` always, so ``t ≥ −1/3``.
    """
    t = (b - a) / (3.0 * a + b + 2.0 * TINY)
    far = log_sum - 0.6931471805599453 - log_a
    log1p_x = tl.where(t <= 1.0 / 3.0, _atanh_series(t), far)
    return tl.where(a > 0.0, -a * log1p_x, 0.0)


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

    # Pass 1: per-lane online max and rescaled sum of exp for both rows (one exp per entry).
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
        max_p, sum_p = _online_update(max_p, sum_p, zp)
        max_q, sum_q = _online_update(max_q, sum_q, zq)
    row_max_p = tl.max(max_p, axis=0)
    row_max_q = tl.max(max_q, axis=0)
    # log p = (z − max) − log Σ exp(z − max): subtracting the max first keeps log p exact-ish even for ±1e4 logits,
    # where a combined log-normaliser max + log Σ would carry an absolute error of ulp(1e4) ≈ 1e-3.
    log_norm_p = tl.log(tl.sum(sum_p * tl.exp(max_p - row_max_p), axis=0))
    log_norm_q = tl.log(tl.sum(sum_q * tl.exp(max_q - row_max_q), axis=0))
    row_bad = (tl.max(bad, axis=0) > 0) | (row_max_p == neg_inf) | (row_max_q == neg_inf)

    # Pass 2: the per-entry KL terms to the midpoint, accumulated per lane in float32.
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        idx = start + lanes
        inside = idx < vocab
        log_p = (tl.load(p_row + idx, mask=inside, other=neg_inf).to(tl.float32) - row_max_p) - log_norm_p
        log_q = (tl.load(q_row + idx, mask=inside, other=neg_inf).to(tl.float32) - row_max_q) - log_norm_q
        p = tl.exp(log_p)
        q = tl.exp(log_q)
        log_sum = tl.log(p + q + TINY)
        acc += _kl_term_to_midpoint(p, q, log_p, log_sum, TINY) + _kl_term_to_midpoint(q, p, log_q, log_sum, TINY)
    divergence = tl.sum(acc, axis=0) * SCALE
    tl.store(out_ptr + row, tl.where(row_bad, float("nan"), divergence))


def _block_size(vocab: int) -> tuple[int, int]:
    """(BLOCK, num_warps): 4096 lanes (16 per thread with 8 warps) for LLM vocabularies."""
    block = min(4096, max(128, triton.next_power_of_2(vocab)))
    return block, 8 if block >= 2048 else 4


def js_divergence_bits(
    logits_p: torch.Tensor, logits_q: torch.Tensor, *, block: int | None = None, num_warps: int | None = None
) -> torch.Tensor:
    """(n_tokens,) float32 JSD in bits between the rows of two (n_tokens, vocab) logit tensors, NaN for bad rows.

    ``block`` (a power of two) and ``num_warps`` override the launch configuration (for benchmarks/gpu_check.py).
    """
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
    default_block, default_warps = _block_size(vocab)
    block, num_warps = block or default_block, num_warps or default_warps
    with torch.cuda.device(logits_p.device) if logits_p.is_cuda else contextlib.nullcontext():
        _launch(logits_p, logits_q, out, block, num_warps)
    return out


def _launch(logits_p: torch.Tensor, logits_q: torch.Tensor, out: torch.Tensor, block: int, num_warps: int) -> None:
    n_tokens, vocab = logits_p.shape
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

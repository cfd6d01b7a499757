"""Per-token relevance: the Jensen–Shannon distance between two next-token distributions.

    JSD(P || Q) = ½ KL(P || M) + ½ KL(Q || M),   M = ½ (P + Q)
    q_{k,t}     = sqrt(JSD_2(P || Q)) ∈ [0, 1]   (log base 2)

with ``P = p(. | C, y_<t)`` under the full verifier context and ``Q = p(. | C_-k, y_<t)`` under the
leave-one-out context of reward k. Each KL entry is ``−p_v · log1p((q_v − p_v) / 2p_v)``, accurate to ~1e-7
in distance however close the rows; on CUDA the Triton kernel of :mod:`mrtpo_verl.math.relevance_triton`
computes the same form. Why this form, and its speed: ``docs/replay.md`` ("Relevance").
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from mrtpo_verl.math import relevance_triton

__all__ = ["JSBackend", "js_distance", "js_distance_one_to_many"]

JSBackend = Literal["auto", "torch", "triton"]

_LN2 = math.log(2.0)
# Added to 2p in the denominator of (q − p) / 2p: keeps the ratio finite (≤ 1 / tiny) when p = 0, where the
# entry's term p · log1p(ratio) is then exactly 0; it is below half an ulp of 2p for every p ≥ 1e-22.
_TINY = 1e-30
# The torch path reduces at most this many entries per block on CPU (4 MiB per float32 buffer, whatever `chunk` is)
# so that its dozen element-wise passes over a block read from cache (L3) instead of memory, while the blocks stay
# big enough that per-op dispatch is small.
_BLOCK_ENTRIES = 1 << 20
# On a GPU the torch path (the fallback without Triton) wants big blocks (few launches), capped so that its four
# buffers (4 × 2^24 float32 entries, 256 MiB) stay small beside the two full float32 distributions of a long
# response (2 × tokens × vocab × 4 bytes).
_GPU_BLOCK_ENTRIES = 1 << 24


class _Workspace:
    """Float32 (rows, vocab) buffers reused block after block: a fresh allocation per op would page-fault.

    Args:
        rows: rows per block.
        vocab: vocabulary size.
        device: where the buffers live.
        shared_p: also keep ``2p + tiny`` for one P compared with several Q.
    """

    def __init__(self, rows: int, vocab: int, device: torch.device, shared_p: bool = False) -> None:
        def buffer() -> torch.Tensor:
            return torch.empty(rows, vocab, dtype=torch.float32, device=device)

        self._buffer = buffer
        self.p, self.q, self.difference, self.scratch = buffer(), buffer(), buffer(), buffer()
        self.p_denominator = buffer() if shared_p else self.scratch
        self._upcast: torch.Tensor | None = None  # allocated on the first non-float32 input
        self.tiny = torch.tensor(_TINY, dtype=torch.float32, device=device)
        self.neg_tiny = torch.tensor(-_TINY, dtype=torch.float32, device=device)

    def softmax(self, logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Row softmax in float32 into ``out[:rows]``, renormalised with an accurate (cascade) sum.

        torch's CPU softmax accumulates its normaliser lane by lane; at vocab ~1.5e5 the rows then sum to
        1 ± 2e-5, which moves the distance of far-apart rows by a few 1e-6. One ``sum`` and one divide fix it.
        """
        rows = logits.shape[0]
        out = out[:rows]
        if logits.dtype != torch.float32:  # bf16/fp16: upcast into a reused buffer (the softmax reads it once)
            if self._upcast is None:
                self._upcast = self._buffer()
            logits = self._upcast[:rows].copy_(logits)
        torch.softmax(logits, dim=-1, out=out)
        return out.div_(out.sum(dim=-1, keepdim=True))

    def set_p_denominator(self, p: torch.Tensor) -> torch.Tensor:
        """(rows, vocab) ``2p + tiny``, the denominator of ``(q − p) / 2p``."""
        return torch.add(self.tiny, p, alpha=2.0, out=self.p_denominator[: p.shape[0]])

    def kl_sums_to_midpoint(self, p: torch.Tensor, p_denominator: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """``KL(P || M) + KL(Q || M)`` in nats per row, as ``−Σ p·log1p(r_p) − Σ q·log1p(r_q)``.

        ``r_p = (q − p) / 2p`` and ``r_q = (p − q) / 2q`` both come from one difference ``q − p``, so
        their first-order parts cancel exactly between the two sums (see the module docstring).

        Args:
            p: (rows, vocab) float32 probabilities of P.
            p_denominator: (rows, vocab) ``2p + tiny`` (may alias the scratch buffer).
            q: (rows, vocab) float32 probabilities of Q.

        Returns:
            (rows,) float32 divergence sum (NaN for a row that is not a distribution).
        """
        rows = p.shape[0]
        difference, scratch = self.difference[:rows], self.scratch[:rows]
        torch.sub(q, p, out=difference)
        kl_p = torch.div(difference, p_denominator, out=scratch).log1p_().mul_(p).sum(dim=-1)
        torch.add(self.neg_tiny, q, alpha=-2.0, out=scratch)  # −(2q + tiny)
        kl_q = torch.div(difference, scratch, out=scratch).log1p_().mul_(q).sum(dim=-1)
        return kl_p.add_(kl_q).neg_()


def _rows_per_block(vocab: int, chunk: int, device: torch.device) -> int:
    """Rows per block: at most ``chunk``, and at most a cache-sized (CPU) or memory-bounded (GPU) number of entries."""
    entries = _BLOCK_ENTRIES if device.type == "cpu" else _GPU_BLOCK_ENTRIES
    return max(1, min(chunk, entries // max(vocab, 1)))


def _check_shapes(logits_p: torch.Tensor, logits_q: torch.Tensor, chunk: int, name: str) -> None:
    if logits_p.shape != logits_q.shape or logits_p.dim() != 2:
        raise ValueError(
            f"{name} expects two (n_tokens, vocab) tensors of one shape, got "
            f"{tuple(logits_p.shape)} and {tuple(logits_q.shape)}"
        )
    if chunk <= 0:
        raise ValueError(f"chunk must be a positive number of rows, got {chunk}")


def _divergence_to_distance(divergence_bits: torch.Tensor, row_offset: int, name: str) -> torch.Tensor:
    """(rows,) JSD in bits → distance; a NaN row (not a distribution) raises with its index."""
    # Checking the (rows,) result costs nothing, unlike a separate pass over the (rows, vocab) logits.
    bad = torch.isnan(divergence_bits)
    if bool(bad.any()):
        first = (bad.nonzero().flatten()[:5] + row_offset).tolist()
        raise ValueError(
            f"{name}: token rows {first} have no valid distribution (a NaN or +inf logit, or "
            "every logit -inf); mask vocabulary entries with -inf but keep one finite logit per row"
        )
    # Rounding can leave a divergence a hair outside [0, 1]; the distance is defined on it.
    return divergence_bits.clamp_(0.0, 1.0).sqrt_()


def _use_triton(logits: torch.Tensor, backend: JSBackend) -> bool:
    if backend == "torch":
        return False
    if backend == "triton":
        relevance_triton.require_triton()
        return True
    if backend == "auto":
        return logits.is_cuda and relevance_triton.triton_available()
    raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")


def js_distance(
    logits_p: torch.Tensor, logits_q: torch.Tensor, chunk: int = 256, *, backend: JSBackend = "auto"
) -> torch.Tensor:
    """Jensen–Shannon distance (log base 2) between two next-token distributions.

    ``q_t = sqrt(½ KL(P_t || M_t) + ½ KL(Q_t || M_t))`` with ``M_t = ½ (P_t + Q_t)`` and
    ``P_t = softmax(logits_p[t])``, ``Q_t = softmax(logits_q[t])``. Reduction is in float32
    whatever the input dtype (bf16 logits from a GPU forward pass are upcast a block at a time).

    Args:
        logits_p: (n_tokens, vocab) logits under the full verifier context.
        logits_q: (n_tokens, vocab) logits under the leave-one-out context.
        chunk: most rows reduced at a time on the torch path, which also caps a block at 2^20
            entries on CPU (to stay in cache) and 2^24 on a GPU; peak extra memory is four float32
            blocks, O(min(chunk, cap / vocab) * vocab). The Triton kernel needs no intermediate
            and ignores it.
        backend: ``"auto"`` uses the fused Triton kernel for CUDA tensors when Triton imports and
            the torch path otherwise; ``"torch"`` forces the torch path; ``"triton"`` forces the
            kernel (an error if Triton is missing).

    Returns:
        (n_tokens,) float32 distance in [0, 1]; exactly 0 for identical rows.

    Raises:
        ValueError: on mismatched shapes, a non-positive chunk, or a row that is not a
            distribution (NaN, +inf, or all entries -inf).
    """
    _check_shapes(logits_p, logits_q, chunk, "js_distance")
    if _use_triton(logits_p, backend):
        divergence = relevance_triton.js_divergence_bits(logits_p, logits_q)
        return _divergence_to_distance(divergence, 0, "js_distance")
    n_tokens, vocab = logits_p.shape
    distance = torch.empty(n_tokens, dtype=torch.float32, device=logits_p.device)
    block = _rows_per_block(vocab, chunk, logits_p.device)
    work = _Workspace(min(block, n_tokens), vocab, logits_p.device)
    for start in range(0, n_tokens, block):
        rows = slice(start, start + block)
        p = work.softmax(logits_p[rows], work.p)
        q = work.softmax(logits_q[rows], work.q)
        kl_sum = work.kl_sums_to_midpoint(p, work.set_p_denominator(p), q)
        distance[rows] = _divergence_to_distance(kl_sum.mul_(0.5 / _LN2), start, "js_distance")
    return distance


def js_distance_one_to_many(
    logits_full: torch.Tensor, logits_loo: torch.Tensor, chunk: int = 256, *, backend: JSBackend = "auto"
) -> torch.Tensor:
    """Jensen–Shannon distances between one full-context block and K leave-one-out blocks.

    Row for row the same as ``torch.stack([js_distance(logits_full, logits_loo[k]) for k in range(K)])``,
    but the full-context softmax (and its share of the per-entry work) is computed once per block
    of rows and reused for every k, as the replay does with one full context and K leave-one-out
    contexts of the same response.

    Args:
        logits_full: (n_tokens, vocab) logits under the full verifier context.
        logits_loo: (K, n_tokens, vocab) logits under the K leave-one-out contexts.
        chunk: most rows reduced at a time, as in :func:`js_distance`.
        backend: as in :func:`js_distance`; the Triton kernel is called once per k.

    Returns:
        (K, n_tokens) float32 distances in [0, 1].

    Raises:
        ValueError: as :func:`js_distance`, naming the k whose rows are invalid.
    """
    if logits_full.dim() != 2 or logits_loo.dim() != 3 or logits_loo.shape[1:] != logits_full.shape:
        raise ValueError(
            f"js_distance_one_to_many expects (n_tokens, vocab) and (K, n_tokens, vocab) logits, got "
            f"{tuple(logits_full.shape)} and {tuple(logits_loo.shape)}"
        )
    if chunk <= 0:
        raise ValueError(f"chunk must be a positive number of rows, got {chunk}")
    n_contexts, n_tokens = logits_loo.shape[0], logits_full.shape[0]
    distance = torch.empty(n_contexts, n_tokens, dtype=torch.float32, device=logits_full.device)
    if n_contexts == 0:
        return distance
    if _use_triton(logits_full, backend):
        for k in range(n_contexts):
            divergence = relevance_triton.js_divergence_bits(logits_full, logits_loo[k])
            distance[k] = _divergence_to_distance(divergence, 0, f"js_distance_one_to_many[k={k}]")
        return distance
    vocab = logits_full.shape[1]
    block = _rows_per_block(vocab, chunk, logits_full.device)
    work = _Workspace(min(block, n_tokens), vocab, logits_full.device, shared_p=True)
    for start in range(0, n_tokens, block):
        rows = slice(start, start + block)
        p = work.softmax(logits_full[rows], work.p)
        p_denominator = work.set_p_denominator(p)
        for k in range(n_contexts):
            q = work.softmax(logits_loo[k, rows], work.q)
            kl_sum = work.kl_sums_to_midpoint(p, p_denominator, q)
            name = f"js_distance_one_to_many[k={k}]"
            distance[k, rows] = _divergence_to_distance(kl_sum.mul_(0.5 / _LN2), start, name)
    return distance

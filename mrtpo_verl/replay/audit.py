"""The replay checks its own precision where it runs, and says what it computed in.

No CPU test can run the CUDA paths of the replay's compute dtypes, so the run audits them on its own hardware:
every ``mrtpo.replay.audit_every`` steps (and at the first step), each replay rank — a colocated actor worker or
a dedicated replay worker — re-scores :data:`AUDIT_ROWS_PER_RANK` row(s) of its shard, drawn with a generator
seeded by the global step, with IEEE float32 compute (``compute_dtype: fp32``) on the same weights and the same
contexts, and compares them with the relevance the configured ``compute_dtype`` gave, over the needed
(reward, valid token) entries of those rows:

    audit_max_dq  = max |q_configured − q_float32|
    audit_pearson = Pearson correlation of q_configured and q_float32 (the ranks' sums pooled)

Each rank answers its sums in ``meta_info["metrics"]`` (verl's collect makes one list per entry, a value per
rank); the driver (:func:`replay_report`) pools them and warns once per audit where ``audit_max_dq`` exceeds
:data:`AUDIT_MAX_DQ`, naming the dtype and the fix.

Every answer also carries each rank's resolved compute dtype (and, on a dedicated worker, its weights' dtype),
and whether ``compute_dtype: auto`` fell back (e.g. to tf32 where torch has no fp16 matmul with float32 output):
the driver counts them per step and names a fallback once in the log.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from verl.protocol import DataProto

from mrtpo_verl.batch_keys import NEEDED_KEY, RELEVANCE_KEY
from mrtpo_verl.config import ReplayConfig, resolve_compute_dtype

__all__ = [
    "AUDIT_MAX_DQ",
    "AUDIT_ROWS_PER_RANK",
    "GLOBAL_STEP_META_KEY",
    "ReplayAudit",
    "audit_due",
    "audit_rows",
    "audit_sums",
    "compute_dtype_entries",
    "replay_report",
]

logger = logging.getLogger(__name__)

#: ``meta_info`` key of a replay request: the trainer's global step (the audit's schedule and seed).
GLOBAL_STEP_META_KEY = "mrtpo_global_step"
#: Rows each replay rank re-scores in float32 at an audit.
AUDIT_ROWS_PER_RANK = 1
#: Largest |Δq| against float32 compute that the replay's compute dtypes are built to stay within.
AUDIT_MAX_DQ = 0.01

#: Per-rank entries of an answer's ``meta_info["metrics"]`` (read by :func:`replay_report`, not logged as they are).
COMPUTE_DTYPE_ENTRY = "mrtpo_compute_dtype"
WEIGHTS_DTYPE_ENTRY = "mrtpo_weights_dtype"
FALLBACK_ENTRY = "mrtpo_compute_dtype_fallback"
AUDIT_ENTRY = "mrtpo_audit"
#: The order of an audit entry's figures (:func:`audit_sums`).
AUDIT_FIELDS = ("rows", "n", "max_dq", "sum_x", "sum_y", "sum_xx", "sum_yy", "sum_xy", "seconds")


def audit_due(global_step: int | None, audit_every: int) -> bool:
    """True at steps 1, 1 + every, 1 + 2·every, …; never with ``audit_every`` 0 or without a step."""
    return audit_every > 0 and global_step is not None and (int(global_step) - 1) % audit_every == 0


def audit_rows(request: DataProto, global_step: int, count: int = AUDIT_ROWS_PER_RANK) -> list[int]:
    """``count`` rows of the shard with a needed pair and response tokens, drawn by a generator seeded with the step
    (the same rows for the same shard and step), in increasing order."""
    needed = request.batch[NEEDED_KEY].bool().any(dim=1)
    has_tokens = request.batch["response_mask"].bool().any(dim=1)
    eligible = torch.nonzero(needed & has_tokens).flatten()
    generator = torch.Generator().manual_seed(int(global_step))
    drawn = eligible[torch.randperm(eligible.numel(), generator=generator)[:count]]
    return sorted(drawn.tolist())


def audit_sums(configured: torch.Tensor, reference: torch.Tensor, rows: int, seconds: float) -> list[float]:
    """The figures of :data:`AUDIT_FIELDS` for two 1-D relevance tensors over the same entries (float64 sums)."""
    x, y = configured.double().flatten(), reference.double().flatten()
    max_dq = float((x - y).abs().max()) if x.numel() else 0.0
    sums = [float(v) for v in (x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())]
    return [float(rows), float(x.numel()), max_dq, *sums, float(seconds)]


class ReplayAudit:
    """The float32 re-scoring of a few sampled rows, on the scorer's own runner (same weights, same device).

    Args:
        scorer: the replay's scorer (:class:`~mrtpo_verl.replay.scorer.ReplayScorer`).
        replay: ``mrtpo.replay``; ``audit_every`` sets the schedule, the rest builds the float32 reference scorer.
    """

    def __init__(self, scorer: Any, replay: ReplayConfig) -> None:
        self.scorer = scorer
        self.replay = replay
        self._reference: Any = None

    @property
    def reference(self) -> Any:
        """A scorer on the same runner with ``compute_dtype: fp32`` (built at the first audit)."""
        if self._reference is None:
            from mrtpo_verl.replay.scorer import ReplayScorer

            fp32 = dataclasses.replace(self.replay, compute_dtype="fp32")
            self._reference = ReplayScorer.from_config(self.scorer.runner, fp32, self.scorer.padding_side)
        return self._reference

    def due(self, request: DataProto) -> bool:
        return audit_due(request.meta_info.get(GLOBAL_STEP_META_KEY), self.replay.audit_every)

    def __call__(self, request: DataProto, builder: Any, info_keys: Sequence[str], answer: DataProto) -> dict:
        """``{AUDIT_ENTRY: audit_sums(...)}`` on an audit step, else ``{}``.

        Every rank of a sharded runner calls this on the same steps (the step comes with the request), and each
        runs the reference scorer even with no row to audit: its forward passes are collectives.
        """
        from mrtpo_verl.replay.batch_relevance import relevance_for_request

        if not self.due(request):
            return {}
        start = time.perf_counter()
        rows = audit_rows(request, request.meta_info[GLOBAL_STEP_META_KEY])
        configured = reference = torch.zeros(0)
        if rows:
            index = torch.tensor(rows, dtype=torch.long)
            sample = request.select_idxs(index)
            valid = sample.batch[NEEDED_KEY].bool()[:, :, None] & sample.batch["response_mask"].bool()[:, None, :]
            scored = relevance_for_request(sample, builder, self.reference, info_keys).batch[RELEVANCE_KEY]
            configured, reference = answer.batch[RELEVANCE_KEY][index][valid], scored[valid]
        else:  # nothing to audit here; the passes still meet the other ranks'
            self.reference.score([], torch.zeros(0, request.batch[NEEDED_KEY].shape[1], dtype=torch.bool))
        return {AUDIT_ENTRY: audit_sums(configured, reference, len(rows), time.perf_counter() - start)}


def compute_dtype_entries(scorer: Any, requested: str, weights_dtype: str | None = None) -> dict[str, str]:
    """This rank's entries for the answer: the compute dtype it resolved, its weights' dtype (dedicated workers),
    and, where ``compute_dtype: auto`` did not get the device's usual choice, why (else "")."""
    from mrtpo_verl.replay.fp16_matmuls import float32_output_mm_missing

    resolved = str(scorer.compute_dtype)
    device = scorer.device
    fallback = ""
    usual = resolve_compute_dtype(requested, device.type)
    if requested == "auto" and resolved != usual:
        reason = float32_output_mm_missing(device) if usual == "fp16" else None
        fallback = f"auto -> {resolved} instead of {usual} on {device}" + (f": {reason}" if reason else "")
    entries = {COMPUTE_DTYPE_ENTRY: resolved, FALLBACK_ENTRY: fallback}
    if weights_dtype is not None:
        entries[WEIGHTS_DTYPE_ENTRY] = weights_dtype
    return entries


_NAMED: set[str] = set()


def _name_once(key: str, message: str, *args: Any) -> None:
    if key not in _NAMED:
        _NAMED.add(key)
        logger.warning(message, *args)


def _counts(prefix: str, values: Sequence[Any]) -> dict[str, float]:
    counts: dict[str, float] = {}
    for value in values:
        counts[f"{prefix}{value}"] = counts.get(f"{prefix}{value}", 0.0) + 1.0
    return counts


def replay_report(per_rank: Mapping[str, Any], global_step: int, requested: str) -> dict[str, float]:
    """The driver's metrics from the ranks' entries (each a list with a value per rank, as verl collects them).

    - ``mrtpo/replay/compute_dtype/<dtype>``: ranks that computed in ``<dtype>``;
      ``mrtpo/replay/weights_dtype/<dtype>``: dedicated workers whose weights are ``<dtype>``;
    - ``mrtpo/replay/dtype_fallbacks``: ranks where ``compute_dtype: auto`` fell back (named once in the log);
    - on an audit step: ``mrtpo/replay/audit_max_dq`` (max over the ranks), ``mrtpo/replay/audit_pearson`` (from
      the pooled sums; 1 for two equal constant samples), ``mrtpo/replay/audit_rows``, ``audit_tokens``,
      ``audit_time_s`` (the slowest rank), with one warning when ``audit_max_dq > AUDIT_MAX_DQ``.

    Args:
        per_rank: an answer's ``meta_info["metrics"]``.
        global_step: the step (for the messages).
        requested: ``mrtpo.replay.compute_dtype`` as configured.
    """
    metrics: dict[str, float] = {}
    resolved = list(per_rank.get(COMPUTE_DTYPE_ENTRY) or [])
    metrics |= _counts("mrtpo/replay/compute_dtype/", resolved)
    metrics |= _counts("mrtpo/replay/weights_dtype/", list(per_rank.get(WEIGHTS_DTYPE_ENTRY) or []))
    fallbacks = [reason for reason in (per_rank.get(FALLBACK_ENTRY) or []) if reason]
    if FALLBACK_ENTRY in per_rank:
        metrics["mrtpo/replay/dtype_fallbacks"] = float(len(fallbacks))
    for reason in dict.fromkeys(fallbacks):
        _name_once(
            f"fallback:{reason}",
            "mrtpo replay: mrtpo.replay.compute_dtype %s (%d rank(s) at global step %d; counted in "
            "mrtpo/replay/dtype_fallbacks every step). Set mrtpo.replay.compute_dtype=fp32 or tf32 to choose it",
            reason,
            fallbacks.count(reason),
            global_step,
        )
    audits = per_rank.get(AUDIT_ENTRY)
    if not audits:
        return metrics
    pooled = dict.fromkeys(AUDIT_FIELDS, 0.0)
    for figures in audits:
        for name, value in zip(AUDIT_FIELDS, figures, strict=True):
            pooled[name] = max(pooled[name], value) if name in ("max_dq", "seconds") else pooled[name] + value
    metrics |= {
        "mrtpo/replay/audit_max_dq": pooled["max_dq"],
        "mrtpo/replay/audit_pearson": _pearson(pooled),
        "mrtpo/replay/audit_rows": pooled["rows"],
        "mrtpo/replay/audit_tokens": pooled["n"],
        "mrtpo/replay/audit_time_s": pooled["seconds"],
    }
    if pooled["max_dq"] > AUDIT_MAX_DQ:
        dtypes = "/".join(dict.fromkeys(resolved)) or "?"
        logger.warning(
            "mrtpo replay audit at global step %d: relevance from mrtpo.replay.compute_dtype=%s (computed in %s) "
            "differs from float32 compute on the same weights by max |dq| = %.4f (Pearson %.4f) over %d tokens of "
            "%d sampled row(s), above %.2f: the token weights carry that rounding noise. Set "
            "mrtpo.replay.compute_dtype=fp32 or tf32",
            global_step,
            requested,
            dtypes,
            pooled["max_dq"],
            metrics["mrtpo/replay/audit_pearson"],
            int(pooled["n"]),
            int(pooled["rows"]),
            AUDIT_MAX_DQ,
        )
    return metrics


def _pearson(pooled: Mapping[str, float]) -> float:
    n = pooled["n"]
    if n < 1:
        return float("nan")
    cov = pooled["sum_xy"] - pooled["sum_x"] * pooled["sum_y"] / n
    var_x = pooled["sum_xx"] - pooled["sum_x"] ** 2 / n
    var_y = pooled["sum_yy"] - pooled["sum_y"] ** 2 / n
    if var_x <= 0 or var_y <= 0:
        return 1.0 if pooled["max_dq"] == 0 else 0.0
    return cov / math.sqrt(var_x * var_y)

"""Names of the batch fields, ``meta_info`` keys and per-rank metrics MRTPO adds to verl's ``DataProto``.

Defined here only; every layer (estimator, replay, workers, trainer) imports them from this module.
"""

from __future__ import annotations

__all__ = [
    "COUNTER_KEYS",
    "FORWARD_PASSES_KEY",
    "GROUP_CONSTANT_KEY",
    "MRTPO_BLOCK_META_KEY",
    "NEEDED_KEY",
    "PREFIX_TOKENS_SHARED_KEY",
    "RANK_TIME_METRIC",
    "RELEVANCE_KEY",
    "ROWS_UNSCORED_KEY",
    "SKIPPED_PASSES_KEY",
    "TOKENS_REPLAYED_KEY",
    "TRUNCATED_CONTEXTS_KEY",
]

#: (bs, K, L) float32 relevance q_{k,t} of every response token, 0 outside ``response_mask``.
RELEVANCE_KEY = "mrtpo_relevance"
#: (bs, K) bool in a replay request: the rows and rewards whose relevance the estimator will use.
NEEDED_KEY = "mrtpo_needed"
#: (bs, K) bool in a replay request: verifier text k of a row is the same in its whole group.
GROUP_CONSTANT_KEY = "mrtpo_group_constant"

#: Per-row counters of a replay answer (each shard's totals on its row 0).
FORWARD_PASSES_KEY = "mrtpo_forward_passes"
SKIPPED_PASSES_KEY = "mrtpo_skipped_passes"
TOKENS_REPLAYED_KEY = "mrtpo_tokens_replayed"
TRUNCATED_CONTEXTS_KEY = "mrtpo_truncated_contexts"
PREFIX_TOKENS_SHARED_KEY = "mrtpo_prefix_tokens_shared"
ROWS_UNSCORED_KEY = "mrtpo_rows_unscored"
#: The counters, in the order an answer holds them.
COUNTER_KEYS = (
    FORWARD_PASSES_KEY,
    SKIPPED_PASSES_KEY,
    TOKENS_REPLAYED_KEY,
    TRUNCATED_CONTEXTS_KEY,
    PREFIX_TOKENS_SHARED_KEY,
    ROWS_UNSCORED_KEY,
)

#: ``meta_info`` key of a colocated replay request that carries the ``mrtpo`` block (a plain dict).
MRTPO_BLOCK_META_KEY = "mrtpo_block"
#: Per-rank replay time in seconds, in an answer's ``meta_info["metrics"]`` (verl collects it per rank).
RANK_TIME_METRIC = "mrtpo/replay/rank_time_s"

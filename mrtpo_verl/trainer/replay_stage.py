"""The replay stage of a training step: relevance ``q`` (bs, K, L) for the ``mrtpo`` estimator.

Runs after rewards, old log-probs and ref, before the advantage. The driver decides *what* to
replay (exact skipping), hands one ``DataProto`` to a replay backend — a Ray worker
group dispatched by data-parallel rank, or an in-process scorer — and turns what comes back into
the relevance tensor and metrics. Full-vocabulary tensors never leave the workers: they return
(bs, K, L) distances.

Backends implement ``compute_relevance(request: DataProto) -> DataProto`` (the request layout is
:func:`build_request`'s; the answer holds ``mrtpo_relevance`` and per-row counters, see
:mod:`mrtpo_verl.replay.batch_relevance`) and optionally ``before_step(global_step) -> dict``
(e.g. to push the actor's new weights to a dedicated pool and report the cost).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import torch
from verl.protocol import DataProto

from mrtpo_verl.batch_keys import (
    COUNTER_KEYS,
    FORWARD_PASSES_KEY,
    GROUP_CONSTANT_KEY,
    NEEDED_KEY,
    PREFIX_TOKENS_SHARED_KEY,
    RANK_TIME_METRIC,
    RELEVANCE_KEY,
    SKIPPED_PASSES_KEY,
    TOKENS_REPLAYED_KEY,
)
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.estimator import replay_needed, reward_component_matrix
from mrtpo_verl.metrics import relevance_metrics
from mrtpo_verl.ray_metrics import publish
from mrtpo_verl.replay.audit import GLOBAL_STEP_META_KEY, replay_report
from mrtpo_verl.replay.batch_relevance import request_group_constant

__all__ = ["ReplayBackend", "ReplayStage", "ReplayWorkerFailed", "build_replay_stage", "build_request"]

logger = logging.getLogger(__name__)

#: (bs, K) bool in the request: which (response, reward) pairs to score.


class ReplayWorkerFailed(RuntimeError):
    """A replay worker failed; the message names the worker group and the step."""


class ReplayBackend(Protocol):
    name: str

    def compute_relevance(self, request: DataProto) -> DataProto: ...


def build_request(data: DataProto, cfg: MRTPOConfig, needed: torch.Tensor) -> DataProto:
    """The replay request: token ids, masks, the needed pairs and the verifier information.

    The prompt goes as the token ids the rollout fed the policy (not verl's ``raw_prompt`` messages, which
    lack the tools and chat-template options the rollout rendered them with).

    Args:
        data: the step's batch with ``prompts`` (bs, P), ``attention_mask`` (bs, P + L),
            ``responses`` (bs, L), ``response_mask`` (bs, L), and in ``non_tensor_batch`` one
            verifier-info array per ``cfg.verifier_info_keys``.
        cfg: the ``mrtpo`` block.
        needed: (bs, K) bool.
    """
    tensors = {key: data.batch[key] for key in ("prompts", "attention_mask", "responses", "response_mask")}
    tensors[NEEDED_KEY] = needed
    non_tensors = {key: data.non_tensor_batch[key] for key in cfg.verifier_info_keys}
    request = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
    # Verifier-order flags over the whole batch: the DP split below may cut a group (replay/contexts.py).
    request.batch[GROUP_CONSTANT_KEY] = request_group_constant(request, cfg.verifier_info_keys)
    return request


def check_verifier_information(data: DataProto, cfg: MRTPOConfig) -> None:
    """Every configured verifier-info key must be in the batch: checked before any replay runs."""
    missing = [key for key in cfg.verifier_info_keys if key not in data.non_tensor_batch]
    if missing:
        raise KeyError(
            f"mrtpo: no verifier information {missing} in the batch (non_tensor_batch keys: "
            f"{sorted(data.non_tensor_batch)}); the reward function must return each of mrtpo.verifier_info_keys"
        )


class ReplayStage:
    """Decides what to replay, calls the backend, and returns relevance with its metrics."""

    def __init__(self, cfg: MRTPOConfig, algo_config: Any, backend: ReplayBackend) -> None:
        self.cfg = cfg
        self.algo_config = algo_config
        self.backend = backend

    def needed_pairs(self, data: DataProto) -> torch.Tensor:
        """(bs, K) bool: all True without skipping; else the pairs whose group advantage is not 0."""
        rewards = reward_component_matrix(data.non_tensor_batch, self.cfg.reward_keys, len(data))
        if not self.cfg.replay.skip_zero_advantage:
            return torch.ones_like(rewards, dtype=torch.bool)
        norm_by_std = bool(self.algo_config.get("norm_adv_by_std_in_grpo", True)) if self.algo_config else True
        return replay_needed(rewards, data.non_tensor_batch["uid"], 1e-6, norm_by_std, self.algo_config)

    def run(self, data: DataProto, global_step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """Relevance (bs, K, L) for the batch, and the stage's metrics."""
        check_verifier_information(data, self.cfg)
        needed = self.needed_pairs(data)
        metrics: dict[str, float] = {}
        before_step = getattr(self.backend, "before_step", None)
        if before_step is not None:
            metrics.update(before_step(global_step))
        request = build_request(data, self.cfg, needed)
        request.meta_info[GLOBAL_STEP_META_KEY] = global_step  # the ranks' audit schedule and seed
        start = time.perf_counter()
        try:
            answer = self.backend.compute_relevance(request)
        except Exception as error:
            return self._on_failure(error, data, global_step, metrics)
        elapsed = time.perf_counter() - start
        relevance = answer.batch[RELEVANCE_KEY]  # the answer's own tensor: the driver holds it once
        if relevance.dtype != torch.float32:
            raise ReplayWorkerFailed(
                f"mrtpo replay worker group {self.backend.name!r} answered {RELEVANCE_KEY} as {relevance.dtype}; "
                "the replay's answer is float32"
            )
        metrics.update(self._stage_metrics(answer, needed, elapsed))
        # The ranks' compute dtypes, fallbacks and precision audit (mrtpo_verl.replay.audit).
        metrics.update(replay_report(answer.meta_info.get("metrics") or {}, global_step, self.cfg.replay.compute_dtype))
        if metrics["mrtpo/replay/rows_unscored"]:
            logger.warning(
                "mrtpo replay at global step %d: %d response(s) did not fit mrtpo.replay.max_context_tokens=%s even "
                "with their verifier texts cut, and get uniform token weights this step (the replay workers' log "
                "names each row); raise mrtpo.replay.max_context_tokens (or leave it null) if this recurs",
                global_step,
                int(metrics["mrtpo/replay/rows_unscored"]),
                self.cfg.replay.max_context_tokens,
            )
        metrics.update(relevance_metrics(relevance, data.batch["response_mask"], needed, self.cfg.reward_keys))
        publish(metrics, role="driver")
        return relevance, metrics

    def _on_failure(
        self, error: Exception, data: DataProto, global_step: int, metrics: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        message = (
            f"mrtpo replay worker group {self.backend.name!r} failed at global step {global_step}: "
            f"{type(error).__name__}: {error}"
        )
        find_dead = getattr(self.backend, "dead_workers", None)
        dead = find_dead() if find_dead is not None else []
        if dead:
            message += f" (worker(s) no longer answering: {', '.join(dead)})"
        if self.cfg.replay.on_worker_failure != "uniform":
            raise ReplayWorkerFailed(message) from error
        # Zero relevance gives q̄ = 0 and so weight 1 everywhere: exactly GDPO for this step.
        logger.error("%s; using uniform token weights for this step (mrtpo.replay.on_worker_failure=uniform)", message)
        shape = (len(data), len(self.cfg.reward_keys), data.batch["response_mask"].shape[1])
        metrics["mrtpo/replay/failed"] = 1.0
        return torch.zeros(shape), metrics

    @staticmethod
    def _stage_metrics(answer: DataProto, needed: torch.Tensor, elapsed: float) -> dict[str, float]:
        counts = {key: float(answer.batch[key].sum()) for key in COUNTER_KEYS}
        passes = counts[FORWARD_PASSES_KEY] + counts[SKIPPED_PASSES_KEY]
        # Ray backends report each rank's time; the spread shows how evenly the work was split.
        rank_times = [float(t) for t in (answer.meta_info.get("metrics") or {}).get(RANK_TIME_METRIC, [])]
        balance = (
            {"mrtpo/replay/rank_time_s_max": max(rank_times), "mrtpo/replay/rank_time_s_min": min(rank_times)}
            if rank_times
            else {}
        )
        return balance | {
            "mrtpo/replay/time_s": elapsed,
            "mrtpo/replay/forward_passes": counts[FORWARD_PASSES_KEY],
            "mrtpo/replay/skip_fraction": counts[SKIPPED_PASSES_KEY] / passes if passes else 0.0,
            "mrtpo/replay/pair_skip_fraction": 1.0 - float(needed.float().mean()) if needed.numel() else 0.0,
            "mrtpo/replay/tokens_replayed": counts[TOKENS_REPLAYED_KEY],
            "mrtpo/replay/tokens_per_s": counts[TOKENS_REPLAYED_KEY] / elapsed if elapsed > 0 else 0.0,
            "mrtpo/replay/truncated_contexts": counts["mrtpo_truncated_contexts"],
            # Responses over max_context_tokens even with the verifier texts cut: uniform weights this step.
            "mrtpo/replay/rows_unscored": counts["mrtpo_rows_unscored"],
            # Tokens not run thanks to prefix sharing (mrtpo.replay.share_prefix).
            "mrtpo/replay/prefix_tokens_shared": counts[PREFIX_TOKENS_SHARED_KEY],
            "mrtpo/replay/failed": 0.0,
        }


def build_replay_stage(trainer: Any) -> ReplayStage:
    """The replay stage for a running trainer, on the placement ``mrtpo.replay.placement`` asks for."""
    from mrtpo_verl.workers.placement import build_backend

    cfg: MRTPOConfig = trainer.mrtpo_config
    return ReplayStage(cfg, trainer.config.algorithm, build_backend(trainer, cfg))

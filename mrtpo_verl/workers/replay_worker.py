"""``ReplayWorker``: a verl single-controller worker that scores replay requests.

Run through verl's own machinery (``RayWorkerGroup`` on a ``RayResourcePool``), each worker loads
the policy model once, receives the actor's weights when they change, and answers
``compute_relevance`` for its data-parallel shard (split by rank as verl's ``Dispatch.DP_COMPUTE_PROTO`` splits;
the answers put together one rank at a time by :func:`~mrtpo_verl.workers.collect.concat_releasing`). Its Ray
actors are named ``mrtpo_replayReplayWorker_<rank>:<i>``, so the replay shows as its own role in the Ray dashboard.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

from mrtpo_verl.batch_keys import (
    FORWARD_PASSES_KEY,
    NEEDED_KEY,
    PREFIX_TOKENS_SHARED_KEY,
    RANK_TIME_METRIC,
    RELEVANCE_KEY,
    SKIPPED_PASSES_KEY,
    TOKENS_REPLAYED_KEY,
)
from mrtpo_verl.config import FLOAT32_COMPUTE_DTYPES, MRTPOConfig
from mrtpo_verl.workers.collect import DP_COMPUTE_PROTO_RELEASING
from mrtpo_verl.workers.weight_gather import DTYPES

__all__ = ["REPLAY_ROLE", "ReplayWorker", "dedicated_weights_dtype", "weights_to_send"]

logger = logging.getLogger(__name__)

#: Name prefix of the worker group (and so of its Ray actors).
REPLAY_ROLE = "mrtpo_replay"


def dedicated_weights_dtype(dedicated_dtype: str, compute_dtype: str, actor_dtype: str) -> str:
    """The dtype a dedicated worker holds (and receives) the weights in, a ``DTYPES`` name.

    ``dedicated_dtype`` when not ``auto``; with ``auto``, the weights the worker's compute reads: fp16 for the
    fp16-matmul compute, float32 for fp32 / tf32 (the float32 model's relevance, as the colocated replay gathers
    verl's float32 master shards), else ``actor_dtype`` (the actor's compute dtype).

    Args:
        dedicated_dtype: ``mrtpo.replay.dedicated_dtype``.
        compute_dtype: the compute dtype the worker resolved on its own device
            (:func:`~mrtpo_verl.replay.scorer.compute_dtype_for`: ``auto`` never reaches here).
        actor_dtype: the actor's compute dtype (``fp32`` | ``bf16`` | ``fp16``).
    """
    if dedicated_dtype != "auto":
        return dedicated_dtype
    if compute_dtype == "fp16":
        return "fp16"  # what its matmuls read: no cast at each use, half float32's memory and transfer
    return "fp32" if compute_dtype in FLOAT32_COMPUTE_DTYPES else actor_dtype


def weights_to_send(reports: list[dict[str, str]]) -> str:
    """The dtype the driver sends the actor's weights in: the workers' own when they all agree, else fp32 (exact
    for every worker; each copies them into its model's dtype). Each worker's choice is logged once."""
    for rank, report in enumerate(reports):
        logger.info(
            "mrtpo dedicated replay worker %d decided on its device: compute_dtype %s, weights %s%s",
            rank,
            report["compute"],
            report["weights"],
            f" ({report['fallback']})" if report["fallback"] else "",
        )
    chosen = {report["weights"] for report in reports}
    return chosen.pop() if len(chosen) == 1 else "fp32"


class ReplayWorker(Worker):
    """One replay process.

    Args:
        mrtpo_block: the ``mrtpo`` block as a plain dict (validated again here).
        model_path: a local HF model directory, or None for the embedded SmolLM2-135M-Instruct.
        device: "cpu" or "cuda".
        torch_threads: intra-op threads on CPU (None = torch's default).
        dtype: the model's dtype, ``fp32`` | ``bf16`` | ``fp16``, or ``auto``: decided here, on the worker's own
            device, by :func:`dedicated_weights_dtype` from the compute dtype this worker resolves (which probes its
            device's fp16 kernel); :meth:`replay_dtypes` reports the decision.
        actor_dtype: the actor's compute dtype, for ``dtype: auto`` with ``compute_dtype: model``.
    """

    def __init__(
        self,
        mrtpo_block: dict[str, Any],
        model_path: str | None,
        device: str = "cpu",
        torch_threads: int | None = None,
        dtype: str = "fp32",
        actor_dtype: str = "bf16",
    ) -> None:
        super().__init__()
        for name, value, allowed in (("dtype", dtype, ("auto", *DTYPES)), ("actor_dtype", actor_dtype, tuple(DTYPES))):
            if value not in allowed:
                raise ValueError(f"replay worker {name}: got {value!r} (allowed: {' | '.join(allowed)})")
        self.mrtpo = MRTPOConfig.from_block(mrtpo_block)
        self.model_path = model_path
        self.device = device
        self.torch_threads = torch_threads
        self.dtype = dtype
        self.actor_dtype = actor_dtype
        self.model: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> float:
        """Load the model and tokenizer; returns the load time in seconds."""
        from mrtpo_verl.replay.audit import ReplayAudit
        from mrtpo_verl.replay.contexts import ReplayContextBuilder
        from mrtpo_verl.replay.model_loading import load_causal_lm
        from mrtpo_verl.replay.scorer import ReplayScorer, compute_dtype_for

        start = time.perf_counter()
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        if self.dtype == "auto":  # the compute dtype this device supports decides the weights' dtype
            compute_dtype = compute_dtype_for(self.mrtpo.replay.compute_dtype, torch.device(self.device))
            self.dtype = dedicated_weights_dtype("auto", compute_dtype, self.actor_dtype)
        self.model, self.tokenizer = load_causal_lm(self.model_path, dtype=DTYPES[self.dtype])
        self.model.to(self.device)
        self.builder = ReplayContextBuilder.from_config(self.tokenizer, self.mrtpo.reward_keys, self.mrtpo.replay)
        self.scorer = ReplayScorer.from_config(self.model, self.mrtpo.replay)
        self.audit = ReplayAudit(self.scorer, self.mrtpo.replay)
        return time.perf_counter() - start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def replay_dtypes(self) -> dict[str, str]:
        """What this worker decided on its device: ``weights`` and ``compute`` dtype, and ``fallback`` (why
        ``compute_dtype: auto`` did not get the device's usual choice, else "")."""
        from mrtpo_verl.replay.audit import COMPUTE_DTYPE_ENTRY, FALLBACK_ENTRY, compute_dtype_entries

        if self.model is None:
            raise RuntimeError("replay worker: init_model was not called")
        entries = compute_dtype_entries(self.scorer, self.mrtpo.replay.compute_dtype)
        return {"weights": self.dtype, "compute": entries[COMPUTE_DTYPE_ENTRY], "fallback": entries[FALLBACK_ENTRY]}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_weights(self, state_dict: dict[str, torch.Tensor]) -> float:
        """Load the actor's updated weights (a full state dict, tensors or ``StoredTensor`` references, copied into the
        model's dtype); returns the seconds it took."""
        from mrtpo_verl.workers.weight_gather import load_stored

        start = time.perf_counter()
        missing, unexpected = self.model.load_state_dict(load_stored(state_dict), strict=False)
        if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
            raise ValueError(
                f"replay worker: weights do not match the model (missing {missing}, unexpected {unexpected})"
            )
        return time.perf_counter() - start

    @register(dispatch_mode=DP_COMPUTE_PROTO_RELEASING)
    def compute_relevance(self, request: DataProto) -> DataProto:
        """Relevance (shard, K, L) and counters for this worker's shard of the request."""
        from mrtpo_verl.replay.audit import compute_dtype_entries
        from mrtpo_verl.replay.batch_relevance import relevance_for_request

        if self.model is None:
            raise RuntimeError("replay worker: init_model was not called")
        start = time.perf_counter()
        answer = relevance_for_request(request, self.builder, self.scorer, self.mrtpo.verifier_info_keys)
        elapsed = time.perf_counter() - start
        audited = self.audit(request, self.builder, self.mrtpo.verifier_info_keys, answer)
        self._publish(request, answer, elapsed)
        # verl's collect turns each worker's "metrics" dict into lists: the driver sees every worker's figures.
        answer.meta_info["metrics"] = (
            {RANK_TIME_METRIC: elapsed}
            | compute_dtype_entries(self.scorer, self.mrtpo.replay.compute_dtype, self.dtype)
            | audited
        )
        return answer

    def _publish(self, request: DataProto, answer: DataProto, elapsed: float) -> None:
        """This shard's figures to the Ray dashboard (ray.util.metrics), tagged with this worker's role."""
        from mrtpo_verl.metrics import relevance_metrics
        from mrtpo_verl.ray_metrics import publish

        passes = float(answer.batch[FORWARD_PASSES_KEY].sum())
        skipped = float(answer.batch[SKIPPED_PASSES_KEY].sum())
        tokens = float(answer.batch[TOKENS_REPLAYED_KEY].sum())
        figures = {
            "mrtpo/replay/time_s": elapsed,
            "mrtpo/replay/forward_passes": passes,
            "mrtpo/replay/skip_fraction": skipped / (passes + skipped) if passes + skipped else 0.0,
            "mrtpo/replay/tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
            "mrtpo/replay/prefix_tokens_shared": float(answer.batch[PREFIX_TOKENS_SHARED_KEY].sum()),
        }
        figures.update(
            relevance_metrics(
                answer.batch[RELEVANCE_KEY],
                request.batch["response_mask"],
                request.batch[NEEDED_KEY].bool(),
                self.mrtpo.reward_keys,
            )
        )
        publish(figures, role=f"{REPLAY_ROLE}_rank{self.rank}")

"""``ReplayWorker``: a verl single-controller worker that scores replay requests.

Run through verl's own machinery (``RayWorkerGroup`` on a ``RayResourcePool``), each worker loads
the policy model once, receives the actor's weights when they change, and answers
``compute_relevance`` for its data-parallel shard (split by rank as verl's ``Dispatch.DP_COMPUTE_PROTO`` splits;
the answers put together one rank at a time by :func:`~mrtpo_verl.workers.collect.concat_releasing`). Its Ray
actors are named ``mrtpo_replayReplayWorker_<rank>:<i>``, so the replay shows as its own role in the Ray dashboard.
"""

from __future__ import annotations

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
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.workers.collect import DP_COMPUTE_PROTO_RELEASING
from mrtpo_verl.workers.weight_gather import DTYPES

__all__ = ["REPLAY_ROLE", "ReplayWorker"]

#: Name prefix of the worker group (and so of its Ray actors).
REPLAY_ROLE = "mrtpo_replay"
#: Per-rank replay seconds in an answer's ``meta_info["metrics"]`` (one entry per rank after verl's collect).


class ReplayWorker(Worker):
    """One replay process.

    Args:
        mrtpo_block: the ``mrtpo`` block as a plain dict (validated again here).
        model_path: a local HF model directory, or None for the embedded SmolLM2-135M-Instruct.
        device: "cpu" or "cuda".
        torch_threads: intra-op threads on CPU (None = torch's default).
        dtype: the model's dtype, ``fp32`` | ``bf16`` | ``fp16`` (the driver passes
            :func:`~mrtpo_verl.workers.placement.dedicated_weights_dtype`).
    """

    def __init__(
        self,
        mrtpo_block: dict[str, Any],
        model_path: str | None,
        device: str = "cpu",
        torch_threads: int | None = None,
        dtype: str = "fp32",
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"replay worker dtype: got {dtype!r} (allowed: {' | '.join(DTYPES)})")
        self.mrtpo = MRTPOConfig.from_block(mrtpo_block)
        self.model_path = model_path
        self.device = device
        self.torch_threads = torch_threads
        self.dtype = dtype
        self.model: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> float:
        """Load the model and tokenizer; returns the load time in seconds."""
        from mrtpo_verl.replay.contexts import ReplayContextBuilder
        from mrtpo_verl.replay.model_loading import load_causal_lm
        from mrtpo_verl.replay.scorer import ReplayScorer

        start = time.perf_counter()
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        self.model, self.tokenizer = load_causal_lm(self.model_path, dtype=DTYPES[self.dtype])
        self.model.to(self.device)
        self.builder = ReplayContextBuilder.from_config(self.tokenizer, self.mrtpo.reward_keys, self.mrtpo.replay)
        self.scorer = ReplayScorer.from_config(self.model, self.mrtpo.replay)
        return time.perf_counter() - start

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
        from mrtpo_verl.replay.batch_relevance import relevance_for_request

        if self.model is None:
            raise RuntimeError("replay worker: init_model was not called")
        start = time.perf_counter()
        answer = relevance_for_request(request, self.builder, self.scorer, self.mrtpo.verifier_info_keys)
        elapsed = time.perf_counter() - start
        self._publish(request, answer, elapsed)
        # verl's collect turns each worker's "metrics" dict into lists: the driver sees every worker's time.
        answer.meta_info["metrics"] = {RANK_TIME_METRIC: elapsed}
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

"""verl's actor worker with two more methods: the colocated replay, and its weights for a dedicated pool.

``MRTPOTrainer`` puts this class where verl's v1 trainer would put ``ActorRolloutRefWorker``
(``_init_resource_pool_mgr``), so everything verl does with the actor is unchanged.

- :meth:`compute_mrtpo_relevance` (``mrtpo.replay.placement=colocated``): the replay runs in the
  actor's own processes on the actor engine's model, i.e. with exactly the weights that produced
  ``old_log_probs`` and with no second copy of the model. It is dispatched like verl's
  ``compute_log_prob`` (by the actor's data-parallel rank; the answers put together one rank at a time by
  :func:`~mrtpo_verl.workers.collect.concat_releasing`) and runs inside the engine's
  ``eval_mode`` (which loads offloaded parameters and puts them back after). The model's forward
  passes are FSDP collectives, so the scorer keeps every rank's number of passes equal
  (:class:`~mrtpo_verl.replay.model_runners.ShardedModelRunner`).
- :meth:`mrtpo_state_dict` (``placement=dedicated``): the current full weights, to push to the
  replay pool before each step.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from mrtpo_verl.batch_keys import MRTPO_BLOCK_META_KEY, RANK_TIME_METRIC
from mrtpo_verl.compat.verl import (
    actor_engine,
    engine_autocast_dtype,
    engine_device,
    engine_module,
    engine_reshard_after_forward,
    engine_tokenizer,
    engine_ulysses_size,
)
from mrtpo_verl.workers.collect import mesh_compute_proto_releasing

__all__ = ["MRTPOActorRolloutRefWorker"]


class MRTPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """``ActorRolloutRefWorker`` plus :meth:`compute_mrtpo_relevance` and :meth:`mrtpo_state_dict`."""

    _mrtpo_replay: Any = None

    @register(dispatch_mode=mesh_compute_proto_releasing("actor"))
    def compute_mrtpo_relevance(self, request: DataProto) -> DataProto | None:
        """Relevance (shard, K, L) and counters for this rank's shard, on the actor engine's model.

        Args:
            request: a replay request shard (:func:`mrtpo_verl.trainer.replay_stage.build_request`), with the
                ``mrtpo`` block in ``meta_info[MRTPO_BLOCK_META_KEY]``.

        Returns:
            The answer on the ranks verl collects from (all of them without sequence parallelism), else None.
        """
        from mrtpo_verl.replay.audit import compute_dtype_entries
        from mrtpo_verl.replay.batch_relevance import relevance_for_request

        if "actor" not in self.role:
            raise RuntimeError(f"mrtpo colocated replay needs the actor's model; this worker's role is {self.role!r}")
        builder, scorer, info_keys = self._colocated_replay(request.meta_info[MRTPO_BLOCK_META_KEY])
        audit = self._mrtpo_replay[4]
        start = time.perf_counter()
        scorer.runner.begin_call()
        try:
            with actor_engine(self).eval_mode():
                answer = relevance_for_request(request, builder, scorer, info_keys)
                elapsed = time.perf_counter() - start
                if audit.due(request):  # every rank on the same steps: the audit's passes are collectives too
                    scorer.runner.begin_call()
                    audited = audit(request, builder, info_keys, answer)
                else:
                    audited = {}
        except Exception as error:
            # The other ranks raise too, with this rank's message, instead of waiting for it in a collective.
            scorer.runner.release_peers_after_failure(error)
            raise
        # verl's collect turns each rank's "metrics" dict into lists: the driver sees every rank's figures.
        requested = str(audit.replay.compute_dtype)
        answer.meta_info["metrics"] = {RANK_TIME_METRIC: elapsed} | compute_dtype_entries(scorer, requested) | audited
        return answer if actor_engine(self).is_mp_src_rank_with_outputs() else None

    def _colocated_replay(self, mrtpo_block: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
        """Context builder and scorer on the engine's model, built on the first call (with the scorer's float32
        audit, :class:`~mrtpo_verl.replay.audit.ReplayAudit`, kept beside them)."""
        from mrtpo_verl.config import MRTPOConfig
        from mrtpo_verl.replay.audit import ReplayAudit
        from mrtpo_verl.replay.contexts import ReplayContextBuilder
        from mrtpo_verl.replay.model_runners import ShardedModelRunner
        from mrtpo_verl.replay.scorer import ReplayScorer

        if self._mrtpo_replay is None or self._mrtpo_replay[0] != mrtpo_block:
            cfg = MRTPOConfig.from_block(mrtpo_block)
            engine = actor_engine(self)
            if engine_ulysses_size(engine) > 1:
                raise NotImplementedError(
                    "mrtpo colocated replay does not support Ulysses sequence parallelism "
                    f"(ulysses_sequence_parallel_size={engine_ulysses_size(engine)}); "
                    "use mrtpo.replay.placement=dedicated"
                )
            runner = ShardedModelRunner(
                engine_module(engine),
                reshard_after_forward=engine_reshard_after_forward(engine),
                device=engine_device(),
                autocast_dtype=engine_autocast_dtype(engine),
            )
            tokenizer = engine_tokenizer(engine)
            builder = ReplayContextBuilder.from_config(tokenizer, cfg.reward_keys, cfg.replay)
            scorer = ReplayScorer.from_config(runner, cfg.replay)
            audit = ReplayAudit(scorer, cfg.replay)
            self._mrtpo_replay = (mrtpo_block, builder, scorer, cfg.verifier_info_keys, audit)
        _, builder, scorer, info_keys, _ = self._mrtpo_replay
        return builder, scorer, info_keys

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mrtpo_state_dict(self, dtype: str = "auto") -> dict[str, Any] | None:
        """The full (HF-named) weights from rank 0, in ``dtype``, as Ray object references; None from the other ranks.

        Every rank takes part because gathering FSDP shards is collective; only rank 0 receives the full tensors
        (:func:`~mrtpo_verl.workers.weight_gather.gather_weights_to_rank0`), so the other ranks hold no copy. Rank 0
        puts each tensor into Ray's object store as it arrives and drops it; the answer maps each name to a
        :class:`~mrtpo_verl.workers.weight_gather.StoredTensor` (``load_stored`` turns it back into tensors).

        Args:
            dtype: ``fp32`` | ``bf16`` | ``fp16``, or ``auto`` for the engine's compute dtype (its autocast dtype,
                the FSDP mixed-precision ``param_dtype``).
        """
        from mrtpo_verl.workers.weight_gather import DTYPES, gather_weights_to_rank0, store_in_object_store

        engine = actor_engine(self)
        torch_dtype = DTYPES[dtype] if dtype != "auto" else (engine_autocast_dtype(engine) or torch.float32)
        return gather_weights_to_rank0(engine, torch_dtype, keep=store_in_object_store)

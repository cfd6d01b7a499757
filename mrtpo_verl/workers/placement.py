"""Where the replay runs: in the actor's own processes, on a dedicated Ray worker group, or in-process.

- ``colocated`` (``mrtpo.replay.placement``, the default): :class:`ColocatedBackend` calls
  ``compute_mrtpo_relevance`` on verl's actor worker group (our subclass of its
  ``ActorRolloutRefWorker``), so the replay scores with the actor engine's current weights and no
  extra model copy. FSDP (``strategy=fsdp2``) only; see :mod:`mrtpo_verl.workers.actor_worker`.
- ``dedicated``: a ``RayWorkerGroup`` of :class:`ReplayWorker` on its own ``RayResourcePool``
  (CPU or GPU), loading the model itself; before each step it receives the actor's current
  weights, and the cost is a metric.
- ``InProcessBackend``: the same scorer in the calling process (tests, the CPU demo, debugging).

Both Ray backends pad and reorder the request so that every rank gets about the same work
(:mod:`mrtpo_verl.workers.balanced_split`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ray
from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

from mrtpo_verl.compat.ray import liveness_call
from mrtpo_verl.compat.verl import actor_param_dtype
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.workers.balanced_split import dispatch_balanced
from mrtpo_verl.workers.replay_worker import REPLAY_ROLE, ReplayWorker, dedicated_weights_dtype, weights_to_send

__all__ = [
    "ColocatedBackend",
    "DedicatedBackend",
    "InProcessBackend",
    "actor_compute_dtype",
    "actor_weights",
    "build_backend",
    "create_replay_worker_group",
    "dead_workers",
    "dedicated_weights_dtype",
    "workers_per_node",
]


def _plain_block(cfg: MRTPOConfig) -> dict[str, Any]:
    block = dataclasses.asdict(cfg)
    for key in ("reward_keys", "verifier_info_keys", "reward_weights"):
        if block[key] is not None:
            block[key] = list(block[key])
    return block


def create_replay_worker_group(
    cfg: MRTPOConfig,
    model_path: str | None,
    process_on_nodes: list[int],
    device: str = "cpu",
    cpus_per_worker: int = 1,
    dtype: str = "fp32",
    actor_dtype: str = "bf16",
) -> RayWorkerGroup:
    """A ``RayWorkerGroup`` of replay workers, ``process_on_nodes[i]`` of them on node i, models loaded.

    Args:
        cfg: the ``mrtpo`` block.
        model_path: local HF model dir, or None for the embedded SmolLM2.
        process_on_nodes: workers per node (Ray places bundles node by node).
        device: "cpu" or "cuda"; on CPU each bundle asks for ``cpus_per_worker`` CPUs.
        cpus_per_worker: CPU threads of each worker.
        dtype: the workers' model dtype (``fp32`` | ``bf16`` | ``fp16``), or ``auto``: each worker decides on its own
            device (:func:`~mrtpo_verl.workers.replay_worker.dedicated_weights_dtype`; ask it with ``replay_dtypes``).
        actor_dtype: the actor's compute dtype, for ``auto`` with ``compute_dtype: model``.
    """
    use_gpu = device == "cuda"
    _check_resources(process_on_nodes, use_gpu, cpus_per_worker)
    # verl's default max_colocate_count asks for 10 CPUs per bundle; a CPU pool must ask for what it uses.
    pool = RayResourcePool(
        process_on_nodes=process_on_nodes, use_gpu=use_gpu, max_colocate_count=cpus_per_worker, name_prefix=REPLAY_ROLE
    )
    worker_cls = RayClassWithInitArgs(
        cls=ray.remote(ReplayWorker),
        mrtpo_block=_plain_block(cfg),
        model_path=model_path,
        device=device,
        torch_threads=cpus_per_worker,
        dtype=dtype,
        actor_dtype=actor_dtype,
    )
    group = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=worker_cls,
        name_prefix=REPLAY_ROLE,
        device_name="cuda" if use_gpu else "cpu",
    )
    group.init_model()
    return group


def dead_workers(group: RayWorkerGroup, timeout_s: float = 10.0) -> list[str]:
    """``name (rank r)`` of every worker of ``group`` that no longer answers (for failure messages).

    A worker that is still busy with its share of the failed request answers the liveness call only after that
    share (an actor runs its calls in order), so a timeout means "busy", not dead: only Ray's own actor errors
    (the process died, or cannot be reached) count.
    """
    names = list(getattr(group, "worker_names", None) or [f"worker {rank}" for rank in range(len(group.workers))])
    calls = [liveness_call(handle) for handle in group.workers]
    answered, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout_s)  # the busy ones stay unanswered
    dead = []
    for rank, (name, call) in enumerate(zip(names, calls, strict=False)):
        if call not in answered:
            continue
        try:
            ray.get(call)
        except Exception:  # ActorDiedError, ActorUnavailableError, ...: the worker cannot answer
            dead.append(f"{name} (rank {rank})")
    return dead


def _check_resources(process_on_nodes: list[int], use_gpu: bool, cpus_per_worker: int) -> None:
    """Fail with the numbers instead of waiting forever for a placement group Ray cannot place."""
    workers = sum(process_on_nodes)
    wanted = {"CPU": float(workers * cpus_per_worker)} | ({"GPU": float(workers)} if use_gpu else {})
    free = ray.available_resources()
    short = {k: (v, free.get(k, 0.0)) for k, v in wanted.items() if free.get(k, 0.0) < v}
    if short:
        detail = ", ".join(f"{k}: needs {need:g}, free {have:g}" for k, (need, have) in short.items())
        raise RuntimeError(
            f"mrtpo dedicated replay pool cannot be placed ({detail}); leave room for it (e.g. fewer "
            "trainer.n_gpus_per_node, or mrtpo.replay.dedicated_device=cpu) or lower mrtpo.replay.dedicated_workers"
        )


class DedicatedBackend:
    """Replay on a dedicated worker group; pushes fresh weights before a step when given a source.

    Args:
        group: the replay ``RayWorkerGroup``.
        weight_source: optional callable ``() -> state_dict`` (the actor's current weights).
    """

    name = REPLAY_ROLE

    def __init__(self, group: RayWorkerGroup, weight_source: Any = None) -> None:
        self.group = group
        self.weight_source = weight_source

    def before_step(self, global_step: int) -> dict[str, float]:
        if self.weight_source is None:
            return {}
        start = time.perf_counter()
        state_dict = self.weight_source()
        fetched = time.perf_counter()
        reference = ray.put(state_dict)  # one copy in the object store, read by every worker
        load_times = self.group.set_weights(reference)
        return {
            "mrtpo/replay/weight_fetch_s": fetched - start,
            "mrtpo/replay/weight_sync_s": time.perf_counter() - fetched,
            "mrtpo/replay/weight_load_s_max": float(max(load_times)),
        }

    def compute_relevance(self, request: DataProto) -> DataProto:
        return dispatch_balanced(request, self.group.world_size, self.group.compute_relevance)

    def dead_workers(self) -> list[str]:
        return dead_workers(self.group)


class ColocatedBackend:
    """Replay in the actor's processes: ``compute_mrtpo_relevance`` on verl's actor worker group.

    Args:
        actor_group: the trainer's ``actor_rollout_wg`` (workers of
            :class:`~mrtpo_verl.workers.actor_worker.MRTPOActorRolloutRefWorker`).
        cfg: the ``mrtpo`` block, sent with each request.
    """

    name = "actor_rollout (colocated)"

    def __init__(self, actor_group: Any, cfg: MRTPOConfig) -> None:
        if not hasattr(actor_group, "compute_mrtpo_relevance"):
            raise TypeError(
                "mrtpo.replay.placement=colocated needs the actor worker group built by an mrtpo trainer (any v1 mode) "
                f"(MRTPOActorRolloutRefWorker); {type(actor_group).__name__} has no compute_mrtpo_relevance"
            )
        self.group = actor_group
        self.block = _plain_block(cfg)

    def compute_relevance(self, request: DataProto) -> DataProto:
        from mrtpo_verl.batch_keys import MRTPO_BLOCK_META_KEY

        request.meta_info[MRTPO_BLOCK_META_KEY] = self.block
        return dispatch_balanced(request, self.group.world_size, self.group.compute_mrtpo_relevance)

    def dead_workers(self) -> list[str]:
        return dead_workers(self.group)


class InProcessBackend:
    """The same computation in the calling process (no Ray)."""

    name = "in_process"

    def __init__(self, cfg: MRTPOConfig, model: Any, tokenizer: Any) -> None:
        from mrtpo_verl.replay.contexts import ReplayContextBuilder
        from mrtpo_verl.replay.scorer import ReplayScorer

        self.cfg = cfg
        self.builder = ReplayContextBuilder.from_config(tokenizer, cfg.reward_keys, cfg.replay)
        self.scorer = ReplayScorer.from_config(model, cfg.replay)

    def compute_relevance(self, request: DataProto) -> DataProto:
        from mrtpo_verl.replay.batch_relevance import relevance_for_request

        return relevance_for_request(request, self.builder, self.scorer, self.cfg.verifier_info_keys)


def workers_per_node(workers: int, nnodes: int) -> list[int]:
    """``workers`` spread over at most ``nnodes`` nodes as evenly as possible, e.g. 3 on 2 nodes → [2, 1], 1 → [1]."""
    if workers < 1 or nnodes < 1:
        raise ValueError(f"need at least one worker and one node, got {workers} workers on {nnodes} nodes")
    base, extra = divmod(workers, nnodes)
    return [count for count in [base + 1] * extra + [base] * (nnodes - extra) if count]


def actor_compute_dtype(config: Any) -> str:
    """The ``DTYPES`` name of the dtype the actor computes in (:func:`mrtpo_verl.compat.verl.actor_param_dtype`)."""
    from mrtpo_verl.workers.weight_gather import DTYPES

    dtype = actor_param_dtype(config)
    return next(name for name, torch_dtype in DTYPES.items() if torch_dtype == dtype)


def build_backend(trainer: Any, cfg: MRTPOConfig) -> Any:
    """The backend ``mrtpo.replay.placement`` asks for, for a running verl trainer."""
    if cfg.replay.placement == "colocated":
        return ColocatedBackend(trainer.actor_rollout_wg, cfg)
    device = cfg.replay.dedicated_device
    if device == "auto":
        device = "cuda" if str(trainer.config.trainer.get("device", "cuda")) == "cuda" else "cpu"
    per_node = workers_per_node(cfg.replay.dedicated_workers, int(trainer.config.trainer.nnodes))
    # dedicated_dtype auto is decided by each worker where its kernels are (its compute dtype probes its device).
    group = create_replay_worker_group(
        cfg,
        trainer.config.actor_rollout_ref.model.path,
        per_node,
        device,
        cfg.replay.dedicated_cpus_per_worker,
        cfg.replay.dedicated_dtype,
        actor_compute_dtype(trainer.config),
    )
    dtype = weights_to_send(group.replay_dtypes())
    return DedicatedBackend(group, weight_source=lambda: actor_weights(trainer.actor_rollout_wg, dtype))


def actor_weights(actor_group: Any, dtype: str) -> dict[str, Any]:
    """The actor's current full weights in ``dtype``, from its rank 0 (the only rank that holds them)."""
    weights = [w for w in actor_group.mrtpo_state_dict(dtype) if w is not None]
    if len(weights) != 1:
        raise RuntimeError(f"mrtpo: expected the actor's weights from exactly one rank, got {len(weights)}")
    return weights[0]

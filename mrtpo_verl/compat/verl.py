"""verl internals MRTPO relies on (pinned verl 0.9.1), each behind one function.

verl offers public extension points for most of what MRTPO does — ``register_adv_est``,
``register_trainer``, the ``verl.plugins`` entry point, worker ``@register`` methods — and those are
used directly elsewhere. What it does not offer is reached only here:

- the v1 trainer's advantage step (no hook hands an estimator the reward components): its body is
  followed in :func:`finish_advantage_as_verl`;
- the v1 base class's ``trainer_mode`` branches and private hooks (:class:`VerlTrainerSeam`);
- the role → worker-class mapping (:func:`replace_actor_worker_classes`);
- ``separate_async``'s parking of π_old on the CPU (:func:`pi_old_weights`);
- the FSDP actor engine's attributes and weight export (``engine_*`` functions);
- how a worker-group call hands its collect function the ranks' answers (:func:`dp_dispatch_with_collect`,
  :func:`mesh_dispatch_with_collect`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.workers.utils.padding import response_to_nested

from mrtpo_verl.compat import transfer_queue as tq_batch
from mrtpo_verl.compat.ray import remote_class

__all__ = [
    "VERL_ADVANTAGE_FIELDS",
    "VERL_CHECK_FIELDS",
    "VerlTrainerSeam",
    "actor_engine",
    "actor_param_dtype",
    "dp_dispatch_with_collect",
    "engine_autocast_dtype",
    "engine_device",
    "engine_full_weights",
    "engine_module",
    "engine_reshard_after_forward",
    "engine_tokenizer",
    "engine_ulysses_size",
    "fields_of_verl_config_check",
    "finish_advantage_as_verl",
    "hf_state_dict",
    "is_lora_or_qat",
    "mesh_dispatch_with_collect",
    "pi_old_weights",
    "replace_actor_worker_classes",
    "rollout_bypass_mode",
]

#: The fields verl's ``PPOTrainer._compute_advantage`` reads from TransferQueue (verl 0.9.1).
VERL_ADVANTAGE_FIELDS = (
    "uid",
    "response_mask",
    "rm_scores",
    "rollout_log_probs",
    "old_log_probs",
    "ref_log_prob",
    "values",
)


#: Texts of verl's ``validate_config`` assertions that do not name their fields → what to set (verl 0.9.1).
VERL_CHECK_FIELDS = {
    "real_train_batch_size": (
        "data.train_batch_size × actor_rollout_ref.rollout.n to a multiple of trainer.n_gpus_per_node × trainer.nnodes"
    ),
    "train_batch_size (": "data.train_batch_size ≥ actor_rollout_ref.actor.ppo_mini_batch_size",
}


def fields_of_verl_config_check(message: str) -> list[str]:
    """The settings a failed ``validate_config`` assertion is about, when its message does not name them.

    Relies on: the assertion texts of verl 0.9.1's ``verl.utils.config.validate_config`` (:data:`VERL_CHECK_FIELDS`).
    """
    return [hint for phrase, hint in VERL_CHECK_FIELDS.items() if phrase in message]


def rollout_bypass_mode(config: Any) -> bool:
    """``algorithm.rollout_correction.bypass_mode``: ``old_log_probs`` are the rollout's own log-probs.

    Relies on: verl 0.9.1 reading that flag as ``config.algorithm.get("rollout_correction").get("bypass_mode")``.
    """
    rollout_corr_config = config.algorithm.get("rollout_correction", None)
    return bool(rollout_corr_config and rollout_corr_config.get("bypass_mode", False))


def finish_advantage_as_verl(
    trainer: Any,
    data: DataProto,
    batch: tq_batch.KVBatchMeta,
    response_mask: Any,
    metrics: dict,
    around_estimator: Callable[[DataProto], contextlib.AbstractContextManager[Any]],
) -> tq_batch.KVBatchMeta:
    """Steps 1-4 of verl's advantage step on a filled ``data``: KL in reward, rollout correction, the
    estimator (inside ``around_estimator(data)``), and the nested outputs written back.

    Relies on: verl 0.9.1's ``PPOTrainer._compute_advantage`` (``trainer/ppo/v1/trainer_base.py``),
    followed line by line; the contract test pins that method's source.

    Args:
        trainer: the running v1 trainer (``config``, ``kl_ctrl_in_reward``).
        data: the batch with ``token_level_scores`` (bs, L) and whatever the estimator reads.
        batch: the TransferQueue batch the outputs go back to.
        response_mask: the nested (jagged) ``response_mask`` as read, for writing nested outputs.
        metrics: filled with verl's KL and rollout-correction figures.
        around_estimator: a context opened around the estimator call.
    """
    config = trainer.config
    # 1. KL penalty in the reward
    if config.algorithm.use_kl_in_reward:
        data, kl_metrics = apply_kl_penalty(
            data, kl_ctrl=trainer.kl_ctrl_in_reward, kl_penalty=config.algorithm.kl_penalty
        )
        metrics.update(kl_metrics)
    else:
        data.batch["token_level_rewards"] = data.batch["token_level_scores"]

    # 2. rollout correction (decoupled mode only)
    rollout_corr_config = config.algorithm.get("rollout_correction", None)
    rollout_correction = (
        rollout_corr_config is not None and "rollout_log_probs" in data.batch and not rollout_bypass_mode(config)
    )
    if rollout_correction:
        data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
        metrics.update(is_metrics)

    # 3. advantages
    with around_estimator(data):
        data = compute_advantage_for_multi_trajectories(
            data,
            batch_keys=batch.keys,
            adv_estimator=config.algorithm.adv_estimator,
            gamma=config.algorithm.gamma,
            lam=config.algorithm.lam,
            num_repeat=config.actor_rollout_ref.rollout.n,
            norm_adv_by_std_in_grpo=config.algorithm.get("norm_adv_by_std_in_grpo", True),
            config=config.algorithm,
        )

    # 4. nested advantages and returns back to TransferQueue
    out_fields = ["advantages", "returns"]
    if config.algorithm.use_kl_in_reward:
        out_fields.append("token_level_rewards")
    if rollout_correction:
        out_fields.append("response_mask")
        if "rollout_is_weights" in data.batch:
            out_fields.append("rollout_is_weights")
    return tq_batch.write_fields(
        batch, {field: response_to_nested(data.batch[field], response_mask) for field in out_fields}
    )


class VerlTrainerSeam:
    """Mixin in front of a verl v1 trainer class: the trainer's private hooks, turned into public ones.

    - ``trainer_mode`` reads as :attr:`verl_mode` to verl's base class; the configured (registered) name is
      kept in :attr:`registered_mode`;
    - after verl fills its role → worker-class mapping, :meth:`adjust_worker_classes` runs;
    - the advantage step calls :meth:`advantage_step`, which by default is verl's own
      (:meth:`verl_advantage_step`).

    Relies on: verl 0.9.1's ``PPOTrainerBase`` setting ``self.trainer_mode`` from ``trainer.v1.trainer_mode`` and
    branching on it (``== "sync"``: replay buffer, checkpointing, refill sizes; ``trainer.v1.<mode>`` blocks), and
    calling ``_init_resource_pool_mgr()`` and ``_compute_advantage(batch, metrics)``.
    """

    #: The verl trainer mode the class extends ("sync", "colocate_async", "separate_async").
    verl_mode: str = ""
    registered_mode: str | None = None

    @property
    def trainer_mode(self) -> str:
        return self.verl_mode

    @trainer_mode.setter
    def trainer_mode(self, configured: str) -> None:
        self.registered_mode = configured

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()  # type: ignore[misc]
        self.adjust_worker_classes()

    def adjust_worker_classes(self) -> None:
        """Change ``role_worker_mapping`` before the worker groups are built (default: nothing)."""

    def _compute_advantage(self, batch: tq_batch.KVBatchMeta, metrics: dict) -> tq_batch.KVBatchMeta:
        return self.advantage_step(batch, metrics)

    def advantage_step(self, batch: tq_batch.KVBatchMeta, metrics: dict) -> tq_batch.KVBatchMeta:
        """The advantage step on a TransferQueue batch; returns the batch meta with advantages written."""
        return self.verl_advantage_step(batch, metrics)

    def verl_advantage_step(self, batch: tq_batch.KVBatchMeta, metrics: dict) -> tq_batch.KVBatchMeta:
        """verl's own advantage step."""
        return super()._compute_advantage(batch, metrics)  # type: ignore[misc,no-any-return]


def replace_actor_worker_classes(trainer: Any, ours: Callable[[type | None], type | None]) -> None:
    """Put ``ray.remote(ours(verl_class))`` wherever the trainer's role mapping holds a class ``ours`` replaces.

    Relies on: verl 0.9.1's ``_init_resource_pool_mgr`` filling ``trainer.role_worker_mapping`` (role →
    ``ray.remote`` class) before the worker groups are built.
    """
    import ray

    for role, worker in list(trainer.role_worker_mapping.items()):
        replacement = ours(remote_class(worker))
        if replacement is not None:
            trainer.role_worker_mapping[role] = ray.remote(replacement)


@contextlib.contextmanager
def pi_old_weights(trainer: Any) -> Iterator[None]:
    """Inside the block a ``separate_async`` actor holds π_old, the weights its sync cycle started from.

    Relies on: verl 0.9.1's ``DetachActorWorker`` parking π_old in CPU slot 0
    (``save_model_to_cpu``/``restore_model_from_cpu``/``clear_cpu_model``) and the trainer's
    ``local_trigger_step`` (0 at a cycle's first mini-step, where the current weights are π_old).
    """
    step = trainer.local_trigger_step
    if step == 0:
        yield
        return
    wg = trainer.actor_rollout_wg
    wg.save_model_to_cpu(step)
    wg.restore_model_from_cpu(0)
    try:
        yield
    finally:
        wg.restore_model_from_cpu(step)
        wg.clear_cpu_model(step)


def actor_engine(worker: Any) -> Any:
    """The training engine of an ``ActorRolloutRefWorker``.

    Relies on: verl 0.9.1's worker keeping its ``TrainingWorker`` as ``worker.actor`` and that its ``engine``.
    """
    return worker.actor.engine


def engine_module(engine: Any) -> Any:
    """The engine's (FSDP-wrapped) model, None for an engine without one.

    Relies on: verl 0.9.1's ``FSDPEngine.module``.
    """
    return getattr(engine, "module", None)


def engine_autocast_dtype(engine: Any) -> torch.dtype | None:
    """The dtype the engine's forward autocasts to (its FSDP ``param_dtype``); None for an engine without one.

    Relies on: verl 0.9.1's ``FSDPEngine._autocast_dtype``.
    """
    return getattr(engine, "_autocast_dtype", None)


def engine_reshard_after_forward(engine: Any) -> bool:
    """Whether the engine's FSDP2 modules reshard after each forward pass.

    Relies on: verl 0.9.1's ``FSDPEngine.engine_config.reshard_after_forward``.
    """
    return bool(engine.engine_config.reshard_after_forward)


def engine_ulysses_size(engine: Any) -> int:
    """The engine's Ulysses sequence-parallel size (1 without sequence parallelism).

    Relies on: verl 0.9.1's ``FSDPEngine.ulysses_sequence_parallel_size``.
    """
    return int(getattr(engine, "ulysses_sequence_parallel_size", 1))


def engine_tokenizer(engine: Any) -> Any:
    """The tokenizer the engine's model was built with.

    Relies on: verl 0.9.1's ``FSDPEngine.model_config.tokenizer``.
    """
    return engine.model_config.tokenizer


def engine_device() -> torch.device:
    """The device verl's engine moves each micro-batch to.

    Relies on: verl 0.9.1's ``forward_step`` using ``get_device_name()``/``get_device_id()`` of its platform.
    """
    from verl.utils.device import get_device_id, get_device_name

    name = get_device_name()
    return torch.device(name) if name == "cpu" else torch.device(name, get_device_id())


def is_lora_or_qat(engine: Any, wrapped: Any) -> bool:
    """Whether the engine trains LoRA adapters (a PEFT model) or runs quantisation-aware training.

    Relies on: PEFT's ``peft_config`` attribute and verl 0.9.1's ``FSDPEngine._qat_enabled``.
    """
    return hasattr(wrapped, "peft_config") or bool(getattr(engine, "_qat_enabled", False))


def engine_full_weights(engine: Any, wrapped: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """verl's own stream of (HF name, full tensor), LoRA adapters merged into the base weights as verl sends
    them to its rollout.

    Relies on: verl 0.9.1's ``FSDPEngine._merged_lora_per_tensor_param`` (LoRA) and ``get_per_tensor_param``.
    """
    if hasattr(wrapped, "peft_config") and hasattr(engine, "_merged_lora_per_tensor_param"):
        return engine._merged_lora_per_tensor_param()  # type: ignore[no-any-return]
    pairs, _ = engine.get_per_tensor_param()
    return pairs  # type: ignore[no-any-return]


def hf_state_dict(module: Any, wrapped: Any) -> dict[str, Any]:
    """The module's state dict under Hugging Face parameter names.

    Relies on: verl 0.9.1's ``verl.utils.model.convert_weight_keys``.
    """
    from verl.utils.model import convert_weight_keys

    return convert_weight_keys(module.state_dict(), wrapped)  # type: ignore[no-any-return]


def actor_param_dtype(config: Any) -> torch.dtype:
    """The dtype the actor's forward computes in: its FSDP mixed-precision ``param_dtype``, bf16 when unset.

    Relies on: verl 0.9.1's ``FSDPEngine._build_fsdp_module`` defaulting ``param_dtype`` to bf16 (Megatron's engine,
    without an ``fsdp_config.mixed_precision`` block, computes in bf16 too).
    """
    from verl.utils.torch_dtypes import PrecisionType

    actor = config.actor_rollout_ref.actor
    mixed = (actor.get("fsdp_config") or {}).get("mixed_precision") or {}
    return PrecisionType.to_dtype(mixed.get("param_dtype", "bf16"))  # type: ignore[no-any-return]


#: ``collect(answers)``: the ranks' answers as a list the function may empty (each entry released as it goes).
AnswersCollect = Callable[[list[Any]], Any]


def dp_dispatch_with_collect(collect: AnswersCollect) -> dict[str, Any]:
    """A ``@register`` dispatch mode: verl's ``DP_COMPUTE_PROTO`` split of the request, ``collect`` of the answers.

    ``collect`` gets the very list of the ranks' answers (rank order) that the worker-group call got from
    ``ray.get``, so emptying it releases each answer. Answers that are not ``DataProto`` (futures of a non-blocking
    call) go to verl's own collect.

    Relies on: verl 0.9.1's worker-group call (``verl/single_controller/ray/base.py`` ``func_generator``) passing
    its collect function the list ``ray.get`` returned and holding no other reference to its items, and
    ``get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO)`` (its dispatch and collect functions).
    """
    from verl.single_controller.base.decorator import Dispatch, get_predefined_dispatch_fn

    verl_mode = get_predefined_dispatch_fn(Dispatch.DP_COMPUTE_PROTO)

    def collect_fn(worker_group: Any, output: list[Any]) -> Any:
        if not all(isinstance(answer, DataProto) for answer in output):
            return verl_mode["collect_fn"](worker_group, output)
        if len(output) != worker_group.world_size:
            raise RuntimeError(f"{len(output)} answers from a worker group of {worker_group.world_size} ranks")
        return collect(output)

    return {"dispatch_fn": verl_mode["dispatch_fn"], "collect_fn": collect_fn}


def mesh_dispatch_with_collect(mesh_name: str, collect: AnswersCollect) -> dict[str, Any]:
    """A ``@register`` dispatch mode: verl's split of the request over mesh ``mesh_name``'s data-parallel ranks
    (``make_nd_compute_dataproto_dispatch_fn``), ``collect`` of the answers of the ranks verl collects from.

    ``collect`` gets a list of those answers (rank order); the list verl handed over is emptied first, so emptying
    this one releases each answer. Answers that are not ``DataProto`` go to verl's own collect.

    Relies on: verl 0.9.1's ``collect_lazy_compute_data_proto`` (the collect mask cached in
    ``WorkerGroup._collect_info[mesh_name]``, queried with ``_query_collect_info``) and its worker-group call
    passing the list ``ray.get`` returned (see :func:`dp_dispatch_with_collect`).
    """
    from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn

    verl_mode = make_nd_compute_dataproto_dispatch_fn(mesh_name)

    def collect_fn(worker_group: Any, output: list[Any]) -> Any:
        if mesh_name not in worker_group._collect_info:
            worker_group._collect_info[mesh_name] = worker_group._query_collect_info(mesh_name)
        mask = worker_group._collect_info[mesh_name]
        if len(mask) != len(output):
            raise RuntimeError(f"{len(output)} answers for a collect mask of {len(mask)} ranks on mesh {mesh_name!r}")
        kept = [answer for answer, keep in zip(output, mask, strict=True) if keep]
        if not all(isinstance(answer, DataProto) for answer in kept):
            return verl_mode["collect_fn"](worker_group, output)
        output.clear()
        return collect(kept)

    return {"dispatch_fn": verl_mode["dispatch_fn"], "collect_fn": collect_fn}

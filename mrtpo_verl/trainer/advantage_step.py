"""The MRTPO advantage step, written once and mixed into each of verl 0.9.1's v1 trainers.

:class:`MRTPOStep` goes in front of a verl trainer class (``PPOTrainerSync``,
``PPOTrainerColocateAsync``, ``PPOTrainerSeparateAsync``); :mod:`mrtpo_verl.trainer.mrtpo_trainer`
registers one class per mode. Only the advantage step changes. verl's own ``_compute_advantage``
reads a fixed list of fields from TransferQueue and builds a ``non_tensor_batch`` holding ``uid``
alone, so neither verl's ``gdpo`` nor ``mrtpo`` can see the reward components (``tests/trainer``
shows verl's fails for ``gdpo``). Here, for ``gdpo`` and ``mrtpo``:

1. prompt groups missing some of their ``rollout.n`` responses are counted, logged and normalised
   over the responses present as verl's gdpo/grpo do, or refused under
   ``mrtpo.on_incomplete_group=error`` (:mod:`mrtpo_verl.trainer.group_completeness`);
2. the reward components (and, for ``mrtpo``, the verifier information, prompts and responses)
   are read from TransferQueue as well;
3. ``mrtpo`` runs the replay stage (after rewards, old log-probs and ref, before the advantage)
   and puts ``mrtpo_relevance`` (bs, K, L) in the batch. The replay scores with the weights that
   computed ``old_log_probs`` (:meth:`MRTPOStep._replay_weights`): in the asynchronous modes the
   responses were sampled by older weights (up to ``max_off_policy_threshold`` versions), and the
   relevance is that of the policy being trained, as in the sync mode;
4. verl's own advantage path runs on that batch inside
   :func:`mrtpo_verl.advantage_inputs.advantage_inputs`, with the trainer's ``global_steps`` for
   the β warm-up and exact skipping (verl restores ``global_steps`` on resume in every mode);
5. per-reward training metrics (``reward/<key>/...``) and the batch's staleness are reported.

Every other estimator goes to verl's method unchanged. The body of ``_compute_advantage`` below
follows verl 0.9.1's ``PPOTrainer._compute_advantage`` step by step (the only copy of it in this
package); the added lines are marked ``# mrtpo:``. ``tests/trainer/test_mrtpo_trainer_advantage_on_cpu.py``
fails when that upstream method changes, so the copy cannot silently drift.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import apply_kl_penalty
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
from verl.workers.utils.padding import response_to_nested

from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.estimator import RELEVANCE_KEY, reward_component_matrix
from mrtpo_verl.metrics import reward_component_metrics, staleness_metrics
from mrtpo_verl.ray_metrics import publish
from mrtpo_verl.startup import MULTI_REWARD_ESTIMATORS, validate_run_config
from mrtpo_verl.trainer.group_completeness import (
    IncompleteGroupError,
    find_incomplete_groups,
    lenient_message,
    padding_rows,
    strict_message,
)
from mrtpo_verl.trainer.tq_fields import as_float_array, as_object_array

__all__ = ["VERL_ADVANTAGE_FIELDS", "MRTPOStep"]

logger = logging.getLogger(__name__)

#: verl 0.9.1's field list in ``PPOTrainer._compute_advantage``.
VERL_ADVANTAGE_FIELDS = [
    "uid",
    "response_mask",
    "rm_scores",
    "rollout_log_probs",
    "old_log_probs",
    "ref_log_prob",
    "values",
]


class MRTPOStep:
    """Mixin for a verl v1 trainer: reward components in the advantage step and the MRTPO replay.

    Subclasses name the verl mode they extend in :attr:`verl_mode`. verl's base class branches on
    ``self.trainer_mode == "sync"`` (replay buffer class, TransferQueue checkpointing, refill sizes)
    and reads ``trainer.v1.<trainer_mode>`` (e.g. ``parameter_sync_step``); the registered name
    (``mrtpo_sync`` …) is kept in :attr:`registered_mode` while ``trainer_mode`` reads as verl's,
    so each of our modes behaves exactly as the verl mode it extends.
    """

    #: The verl trainer mode this class extends ("sync", "colocate_async", "separate_async").
    verl_mode: str = ""
    #: Set by :meth:`attach_mrtpo` (called from ``on_init_end``); a replay stage for ``mrtpo``.
    mrtpo_config: MRTPOConfig | None = None
    replay_stage: Any = None
    registered_mode: str | None = None

    # Annotations of what the verl trainer provides (the mixin is always combined with one).
    config: Any
    global_steps: int
    actor_rollout_wg: Any

    @property
    def trainer_mode(self) -> str:
        return self.verl_mode

    @trainer_mode.setter
    def trainer_mode(self, configured: str) -> None:
        self.registered_mode = configured

    def _init_resource_pool_mgr(self) -> None:
        """verl's mapping, with actor worker classes that can also run the replay and hand out their weights."""
        super()._init_resource_pool_mgr()  # type: ignore[misc]
        import ray

        from mrtpo_verl.trainer.actor_workers import mrtpo_actor_class

        for role, worker in list(self.role_worker_mapping.items()):  # type: ignore[attr-defined]
            ours = mrtpo_actor_class(getattr(worker, "__ray_actor_class__", None))
            if ours is not None:
                self.role_worker_mapping[role] = ray.remote(ours)  # type: ignore[attr-defined]

    def on_init_end(self) -> None:
        super().on_init_end()  # type: ignore[misc]
        self.attach_mrtpo()

    def attach_mrtpo(self, replay_stage: Any = None) -> None:
        """Validate the ``mrtpo`` block and set up the replay stage (once the worker groups exist)."""
        self.mrtpo_config = validate_run_config(self.config)
        if self.mrtpo_config is not None and str(self.config.algorithm.adv_estimator) == "mrtpo":
            if replay_stage is None:
                from mrtpo_verl.trainer.replay_stage import build_replay_stage

                replay_stage = build_replay_stage(self)
            self.replay_stage = replay_stage

    @contextlib.contextmanager
    def _replay_weights(self) -> Iterator[None]:
        """The actor holds the weights that computed ``old_log_probs`` inside this block (here: always)."""
        yield

    def _check_batch(self, batch: KVBatchMeta, metrics: dict, cfg: MRTPOConfig) -> None:
        """Incomplete prompt groups counted (and refused under ``on_incomplete_group=error``); staleness."""
        tags = list(batch.tags) if batch.tags else [{} for _ in batch.keys]
        n = int(self.config.actor_rollout_ref.rollout.n)
        mode = self.registered_mode or self.verl_mode
        incomplete = find_incomplete_groups(batch.keys, tags, n)
        if incomplete and cfg.on_incomplete_group == "error":
            raise IncompleteGroupError(strict_message(incomplete, mode))
        if incomplete:
            logger.warning(lenient_message(incomplete, mode))
        figures = incomplete.metrics() | staleness_metrics(tags, self.global_steps)
        metrics.update(figures)
        publish(figures, role="driver")

    def _reward_metrics(self, data: DataProto, batch: KVBatchMeta, cfg: MRTPOConfig) -> dict[str, float]:
        """``reward/<key>/...`` over the batch's real responses (verl's padding rows left out)."""
        tags = list(batch.tags) if batch.tags else [{} for _ in batch.keys]
        real = np.flatnonzero(~np.asarray(padding_rows(tags), dtype=bool))
        rewards = reward_component_matrix(data.non_tensor_batch, cfg.reward_keys, len(data))[torch.as_tensor(real)]
        return reward_component_metrics(rewards, data.non_tensor_batch["uid"][real], cfg.reward_keys)

    def _compute_advantage(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        estimator = str(self.config.algorithm.adv_estimator)
        if estimator not in MULTI_REWARD_ESTIMATORS:
            return super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        if self.mrtpo_config is None:
            self.attach_mrtpo()
        assert self.mrtpo_config is not None
        cfg = self.mrtpo_config
        self._check_batch(batch, metrics, cfg)  # mrtpo: incomplete groups counted (or refused) before any replay

        # Same fields as verl, plus what gdpo needs (prompts for its response-length arithmetic) and ours.
        fields = [*VERL_ADVANTAGE_FIELDS, "prompts", "responses", "extra_fields", *cfg.reward_keys]  # mrtpo
        if estimator == "mrtpo":
            fields += [*cfg.verifier_info_keys, "raw_prompt"]  # mrtpo: replay inputs
        first = tq.kv_batch_get(keys=batch.keys[:1], partition_id=batch.partition_id)  # mrtpo
        available = set(first.keys()) | _reward_extra_keys(first)  # mrtpo
        _require_fields(available, cfg, estimator)  # mrtpo: clear error before any replay
        data = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=[f for f in fields if f in available]
        )

        response_mask = data["response_mask"]
        prompt_lengths = _prompt_lengths(data)  # mrtpo
        non_tensor = _pop_non_tensor_fields(data, cfg, estimator)  # mrtpo: components and verifier info
        data = DataProto(batch=data.to_padded_tensor(), non_tensor_batch=non_tensor)
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        _add_full_attention_mask(data, prompt_lengths)  # mrtpo: gdpo reads prompts + attention_mask

        reward_metrics = self._reward_metrics(data, batch, cfg)  # mrtpo: per-reward training figures
        metrics.update(reward_metrics)
        publish(reward_metrics, role="driver")
        if estimator == "mrtpo":  # mrtpo: the replay stage, with the weights that computed old_log_probs
            with self._replay_weights():
                relevance, replay_metrics = self.replay_stage.run(data, global_step=self.global_steps)
            data.batch[RELEVANCE_KEY] = relevance
            metrics.update(replay_metrics)
            if cfg.dump_dir is not None:  # mrtpo: token-credit pictures of a real run
                from mrtpo_verl.trainer.credit_dump import dump_step

                dump_step(cfg.dump_dir, data, relevance, cfg, self.global_steps, self.tokenizer)

        # 1. apply kl penalty to rewards
        if self.config.algorithm.use_kl_in_reward:
            data, kl_metrics = apply_kl_penalty(
                data, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty
            )
            metrics.update(kl_metrics)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]

        # 2. rollout correction (decoupled mode only), as verl does
        rollout_corr_config = self.config.algorithm.get("rollout_correction", None)
        bypass_recomputing_logprobs = rollout_corr_config and rollout_corr_config.get("bypass_mode", False)
        rollout_correction = (
            rollout_corr_config is not None and "rollout_log_probs" in data.batch and not bypass_recomputing_logprobs
        )
        if rollout_correction:
            data, is_metrics = compute_rollout_correction_and_add_to_batch(data, rollout_corr_config)
            metrics.update(is_metrics)

        # 3. compute advantages (mrtpo: inside the context that hands the estimator its inputs)
        with advantage_inputs(data, cfg, self.global_steps) as inputs:
            data = compute_advantage_for_multi_trajectories(
                data,
                batch_keys=batch.keys,
                adv_estimator=self.config.algorithm.adv_estimator,
                gamma=self.config.algorithm.gamma,
                lam=self.config.algorithm.lam,
                num_repeat=self.config.actor_rollout_ref.rollout.n,
                norm_adv_by_std_in_grpo=self.config.algorithm.get("norm_adv_by_std_in_grpo", True),
                config=self.config.algorithm,
            )
        metrics.update(inputs.metrics)
        publish(inputs.metrics, role="driver")  # mrtpo: β_s and weight maxima to the Ray dashboard too

        # 4. write nested advantages and returns back to TransferQueue
        out_fields = ["advantages", "returns"]
        if self.config.algorithm.use_kl_in_reward:
            out_fields.append("token_level_rewards")
        if rollout_correction:
            out_fields.append("response_mask")
            if "rollout_is_weights" in data.batch:
                out_fields.append("rollout_is_weights")
        output = {field: response_to_nested(data.batch[field], response_mask) for field in out_fields}
        return tq.kv_batch_put(
            keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(output, batch_size=len(batch))
        )


def _require_fields(available: set[str], cfg: MRTPOConfig, estimator: str) -> None:
    """Every configured reward key (and, for mrtpo, verifier-info key) must be in TransferQueue."""
    needed = list(cfg.reward_keys) + (list(cfg.verifier_info_keys) if estimator == "mrtpo" else [])
    missing = [key for key in needed if key not in available]
    if missing:
        raise KeyError(
            f"mrtpo: the batch has no field(s) {missing} (reward function output); available: {sorted(available)}. "
            "The reward function must return every mrtpo.reward_keys and mrtpo.verifier_info_keys entry"
        )


def _reward_extra_keys(first: TensorDict) -> set[str]:
    """Reward-function outputs of the first sample kept in ``extra_fields["reward_extra_info"]``.

    verl 0.9.1's agent loop (``verl/trainer/ppo/v1/agent_loop_tq.py``) stores the reward function's
    extra keys per sample there rather than as top-level TransferQueue fields.
    """
    if "extra_fields" not in first.keys():  # noqa: SIM118  (TensorDict)
        return set()
    row = as_object_array(first["extra_fields"])[0] or {}
    return set((row.get("reward_extra_info") or {}).keys())


def _reward_output(data: TensorDict, extra: np.ndarray | None, key: str) -> Any:
    """A reward-function output column: a top-level field, else each sample's ``reward_extra_info[key]``."""
    if key in data.keys():  # noqa: SIM118  (TensorDict)
        return data.pop(key)
    if extra is None:
        raise KeyError(f"mrtpo: no field {key!r} in the batch")
    column = []
    for row, fields in enumerate(extra):
        info = (fields or {}).get("reward_extra_info") or {}
        if key not in info:
            raise KeyError(f"mrtpo: sample {row} has no reward output {key!r} (reward_extra_info: {sorted(info)})")
        column.append(info[key])
    return column


def _pop_non_tensor_fields(data: TensorDict, cfg: MRTPOConfig, estimator: str) -> dict[str, np.ndarray]:
    """Move uid, reward components, verifier info and raw prompts out of the TensorDict."""
    non_tensor: dict[str, np.ndarray] = {"uid": as_object_array(data.pop("uid"))}
    extra = as_object_array(data.pop("extra_fields")) if "extra_fields" in data.keys() else None  # noqa: SIM118
    for key in cfg.reward_keys:
        non_tensor[key] = as_float_array(_reward_output(data, extra, key), key)
    if estimator == "mrtpo":
        for key in cfg.verifier_info_keys:
            non_tensor[key] = as_object_array(_reward_output(data, extra, key))
        if "raw_prompt" in data.keys():  # noqa: SIM118  (TensorDict)
            non_tensor["raw_prompt"] = as_object_array(data.pop("raw_prompt"))
    return non_tensor


def _prompt_lengths(data: TensorDict) -> Any:
    """(bs,) prompt lengths from the nested ``prompts`` field, before it is padded."""
    return data["prompts"].offsets().diff()


def _add_full_attention_mask(data: DataProto, prompt_lengths: Any) -> None:
    """``attention_mask`` over [prompt | response], prompts right-padded as ``to_padded_tensor`` leaves them.

    verl's ``gdpo`` reads the response length as ``attention_mask[:, prompt_width:].sum() - 1``, and
    the replay reads each prompt's own tokens from it; the layout is the one verl's
    ``_compute_reward_colocate`` builds.
    """
    import torch

    prompts = data.batch["prompts"]
    positions = torch.arange(prompts.shape[1], device=prompts.device)
    prompt_mask = (positions[None, :] < prompt_lengths.to(prompts.device)[:, None]).long()
    data.batch["attention_mask"] = torch.cat([prompt_mask, data.batch["response_mask"].long()], dim=1)

"""The MRTPO advantage step, written once and mixed into each of verl's v1 trainers.

:class:`MRTPOStep` goes in front of a verl trainer class (``PPOTrainerSync``,
``PPOTrainerColocateAsync``, ``PPOTrainerSeparateAsync``); :mod:`mrtpo_verl.trainer.mrtpo_trainer`
registers one class per mode. verl's own advantage step hands the estimator a batch with ``uid``
alone, so neither ``gdpo`` nor ``mrtpo`` could see the reward components. For those two estimators
the step here:

1. counts prompt groups missing some of their ``rollout.n`` responses and normalises them over the
   responses present, as verl's gdpo/grpo do, or refuses them under
   ``mrtpo.on_incomplete_group=error`` (:mod:`mrtpo_verl.trainer.group_completeness`);
2. reads the reward components (and, for ``mrtpo``, the verifier information, prompts and responses)
   with verl's fields;
3. for ``mrtpo`` runs the replay stage and puts ``mrtpo_relevance`` (bs, K, L) in the batch, scored with
   the weights that computed ``old_log_probs`` (:meth:`MRTPOStep._replay_weights`), on each response exactly as
   the policy saw it (see below), and counts the rows where that is not so (``mrtpo/replay/rows_context_mismatch``);
4. finishes as verl does (:func:`mrtpo_verl.compat.verl.finish_advantage_as_verl`), with the estimator
   inside :func:`mrtpo_verl.advantage_inputs.advantage_inputs` (inputs, global step for the β warm-up);
5. reports per-reward training metrics (``reward/<key>/...``) and the batch's staleness.

Every other estimator goes to verl's own method unchanged.

The layout both estimators read is verl's: TransferQueue stores each row's prompt and response unpadded (the
response holds every token the agent loop appended after the prompt, tool outputs between turns included), so
lengths, not a mask, say where each row ends. ``attention_mask`` (bs, P + L) is built from those lengths as
verl's own v1 trainer builds it (:func:`mrtpo_verl.compat.transfer_queue.rollout_attention_mask`), the same in
every trainer mode (the three modes share this step and read the same stored fields). ``gdpo`` reads the
response length as ``attention_mask[:, P:].sum() - 1``; the replay reads each prompt's and response's tokens from
it, so tool outputs are replayed as context; ``response_mask`` (1 on generated tokens) only says where
relevance may be non-zero.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto

from mrtpo_verl.advantage_inputs import AdvantageInputs, advantage_inputs
from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.compat import transfer_queue as tq_batch
from mrtpo_verl.compat.transfer_queue import KVBatchMeta
from mrtpo_verl.compat.verl import (
    VERL_ADVANTAGE_FIELDS,
    VerlTrainerSeam,
    finish_advantage_as_verl,
    replace_actor_worker_classes,
)
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.estimator import reward_component_matrix
from mrtpo_verl.metrics import reward_component_metrics, staleness_metrics
from mrtpo_verl.ray_metrics import publish
from mrtpo_verl.replay.batch_relevance import context_mismatches
from mrtpo_verl.startup import MULTI_REWARD_ESTIMATORS, check_run
from mrtpo_verl.trainer.group_completeness import (
    IncompleteGroupError,
    find_incomplete_groups,
    lenient_message,
    padding_rows,
    strict_message,
)

__all__ = ["MRTPOStep"]

logger = logging.getLogger(__name__)

#: Rows whose replayed response tokens differ from the rollout's stored ones (count and ids), per step.
CONTEXT_MISMATCH_METRIC = "mrtpo/replay/rows_context_mismatch"


class MRTPOStep(VerlTrainerSeam):
    """Mixin for a verl v1 trainer: reward components in the advantage step and the MRTPO replay.

    Subclasses name the verl mode they extend in ``verl_mode``; ``trainer_mode`` reads as that mode to
    verl's base class, so each of our modes behaves as the verl mode it extends.
    """

    #: Set by :meth:`attach_mrtpo` (called from ``on_init_end``); a replay stage for ``mrtpo``.
    mrtpo_config: MRTPOConfig | None = None
    replay_stage: Any = None
    #: Set once the context-mismatch warning has been logged (it is given once per trainer).
    context_mismatch_logged: bool = False

    # Annotations of what the verl trainer provides (the mixin is always combined with one).
    config: Any
    global_steps: int
    actor_rollout_wg: Any

    def adjust_worker_classes(self) -> None:
        """verl's mapping, with actor worker classes that can also run the replay and hand out their weights."""
        from mrtpo_verl.trainer.actor_workers import mrtpo_actor_class

        replace_actor_worker_classes(self, mrtpo_actor_class)

    def on_init_end(self) -> None:
        super().on_init_end()  # type: ignore[misc]
        self.attach_mrtpo()

    def attach_mrtpo(self, replay_stage: Any = None) -> None:
        """Validate the ``mrtpo`` block and set up the replay stage (once the worker groups exist)."""
        self.mrtpo_config = check_run(self.config, process="trainer").mrtpo
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
        tags = tq_batch.batch_tags(batch)
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
        tags = tq_batch.batch_tags(batch)
        real = np.flatnonzero(~np.asarray(padding_rows(tags), dtype=bool))
        rewards = reward_component_matrix(data.non_tensor_batch, cfg.reward_keys, len(data))[torch.as_tensor(real)]
        return reward_component_metrics(rewards, data.non_tensor_batch["uid"][real], cfg.reward_keys)

    def advantage_step(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        estimator = str(self.config.algorithm.adv_estimator)
        if estimator not in MULTI_REWARD_ESTIMATORS:
            return self.verl_advantage_step(batch, metrics)
        if self.mrtpo_config is None:
            self.attach_mrtpo()
        assert self.mrtpo_config is not None
        cfg = self.mrtpo_config
        self._check_batch(batch, metrics, cfg)  # incomplete groups counted (or refused) before any replay

        # verl's fields, plus the prompts (gdpo's response-length arithmetic), reward outputs and replay inputs.
        fields = [*VERL_ADVANTAGE_FIELDS, "prompts", "responses", "extra_fields", *cfg.reward_keys]
        if estimator == "mrtpo":
            fields += [*cfg.verifier_info_keys, "raw_prompt"]
        available = tq_batch.available_fields(tq_batch.read_fields(batch, rows=1))
        _require_fields(available, cfg, estimator)  # a clear error before any replay
        data = tq_batch.read_fields(batch, [f for f in fields if f in available])

        response_mask = data["response_mask"]
        prompt_lengths, response_lengths = tq_batch.prompt_lengths(data), tq_batch.response_lengths(data)
        stored_responses = tq_batch.stored_response_ids(data)  # the rollout's own record, for the context check
        non_tensor = _pop_non_tensor_fields(data, cfg, estimator)
        data = DataProto(batch=data.to_padded_tensor(), non_tensor_batch=non_tensor)
        data.batch["token_level_scores"] = data.batch["rm_scores"]
        _add_full_attention_mask(data, prompt_lengths, response_lengths)  # gdpo reads prompts + attention_mask

        reward_metrics = self._reward_metrics(data, batch, cfg)
        metrics.update(reward_metrics)
        publish(reward_metrics, role="driver")
        if estimator == "mrtpo":
            context_metrics = self._check_replay_context(data, stored_responses, batch)
            metrics.update(context_metrics)
            publish(context_metrics, role="driver")
            with self._replay_weights():
                relevance, replay_metrics = self.replay_stage.run(data, global_step=self.global_steps)
            data.batch[RELEVANCE_KEY] = relevance
            metrics.update(replay_metrics)
            if cfg.dump_dir is not None:  # token-credit pictures of a real run
                from mrtpo_verl.trainer.credit_dump import dump_step

                dump_step(cfg.dump_dir, data, relevance, cfg, self.global_steps, self.tokenizer)

        opened: list[AdvantageInputs] = []

        @contextlib.contextmanager
        def estimator_inputs(filled: DataProto) -> Iterator[None]:
            with advantage_inputs(filled, cfg, self.global_steps) as inputs:
                opened.append(inputs)
                yield

        written = finish_advantage_as_verl(self, data, batch, response_mask, metrics, estimator_inputs)
        metrics.update(opened[0].metrics)
        publish(opened[0].metrics, role="driver")  # β_s and weight maxima to the Ray dashboard too
        return written

    def _check_replay_context(
        self, data: DataProto, stored_responses: list[torch.Tensor], batch: KVBatchMeta
    ) -> dict[str, float]:
        """``mrtpo/replay/rows_context_mismatch``: rows whose replayed response is not the rollout's (count, ids).

        The replay's response tokens (read from ``data`` as the replay reads them) are compared with the response
        ids verl stored for the rollout and the length its agent loop tagged each row with, never with the mask
        the replay reads. The first step with a mismatch logs one warning naming the rows.
        """
        mismatches = context_mismatches(data, stored_responses, tq_batch.tagged_response_lengths(batch))
        if mismatches and not self.context_mismatch_logged:
            self.context_mismatch_logged = True
            logger.warning(
                "mrtpo replay at global step %d: %d of %d row(s) would replay response tokens other than those the "
                "rollout produced for the policy (%s%s); their relevance is computed on another context. Counted "
                "every step in %s (this warning is given once); the batch layout of this verl version is not the "
                "one mrtpo_verl.compat.transfer_queue expects",
                self.global_steps,
                len(mismatches),
                len(data),
                "; ".join(m.describe() for m in mismatches[:3]),
                "; ..." if len(mismatches) > 3 else "",
                CONTEXT_MISMATCH_METRIC,
            )
        return {CONTEXT_MISMATCH_METRIC: float(len(mismatches))}


def _require_fields(available: set[str], cfg: MRTPOConfig, estimator: str) -> None:
    """Every configured reward key (and, for mrtpo, verifier-info key) must be in TransferQueue."""
    needed = list(cfg.reward_keys) + (list(cfg.verifier_info_keys) if estimator == "mrtpo" else [])
    missing = [key for key in needed if key not in available]
    if missing:
        raise KeyError(
            f"mrtpo: the batch has no field(s) {missing} (reward function output); available: {sorted(available)}. "
            "The reward function must return every mrtpo.reward_keys and mrtpo.verifier_info_keys entry"
        )


def _pop_non_tensor_fields(data: TensorDict, cfg: MRTPOConfig, estimator: str) -> dict[str, np.ndarray]:
    """Move uid, reward components, verifier info and raw prompts out of the TensorDict."""
    non_tensor: dict[str, np.ndarray] = {"uid": tq_batch.object_column(data.pop("uid"))}
    has_extra = "extra_fields" in data.keys()  # noqa: SIM118  (TensorDict)
    extra = tq_batch.object_column(data.pop("extra_fields")) if has_extra else None
    for key in cfg.reward_keys:
        non_tensor[key] = tq_batch.float_column(tq_batch.pop_reward_output(data, extra, key), key)
    if estimator == "mrtpo":
        for key in cfg.verifier_info_keys:
            non_tensor[key] = tq_batch.object_column(tq_batch.pop_reward_output(data, extra, key))
        if "raw_prompt" in data.keys():  # noqa: SIM118  (TensorDict)
            non_tensor["raw_prompt"] = tq_batch.object_column(data.pop("raw_prompt"))
    return non_tensor


def _add_full_attention_mask(data: DataProto, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor) -> None:
    """``attention_mask`` (bs, P + L) over [prompt | response], from the stored lengths as verl's v1 trainer builds it.

    Prompts and responses are right-padded as ``to_padded_tensor`` leaves them; every stored response token is
    covered, tool outputs between turns included (``response_mask`` is 0 there, but the policy saw them).
    """
    data.batch["attention_mask"] = tq_batch.rollout_attention_mask(
        prompt_lengths, response_lengths, data.batch["prompts"].shape[1], data.batch["responses"].shape[1]
    )

"""Relevance for one replay request (a ``DataProto`` shard): what a replay worker runs.

Shared by every placement (a Ray worker, the actor's own processes, or in-process), so they all
compute the same thing. The request layout is :func:`mrtpo_verl.trainer.replay_stage.build_request`'s:

- batch ``prompts`` (bs, P) with ``attention_mask`` (bs, P + L) marking each prompt's own tokens,
  ``responses`` (bs, L), ``response_mask`` (bs, L), ``mrtpo_needed`` (bs, K) bool and, optionally,
  ``mrtpo_group_constant`` (bs, K) bool (the verifier-order rule's flags over the whole batch);
- non_tensor_batch: one verifier-information array per reward (in reward order) and, when verl
  kept it, ``raw_prompt`` (chat messages), which is preferred over the prompt ids.

The answer holds ``mrtpo_relevance`` (bs, K, L) float32 and counters as (bs,) tensors whose sums
are the shard's totals (row 0 carries them), so that verl's DP collect can simply concatenate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from verl.protocol import DataProto

from mrtpo_verl.replay.contexts import ReplayContextBuilder, count_truncated_verifiers, group_constant_flags
from mrtpo_verl.replay.scorer import ReplayScorer

__all__ = ["relevance_for_request"]

RELEVANCE_KEY = "mrtpo_relevance"
NEEDED_KEY = "mrtpo_needed"
#: (bs, K) bool in the request: verifier text k of a row is the same in its whole group (the order rule's input).
GROUP_CONSTANT_KEY = "mrtpo_group_constant"


def _prompts(request: DataProto) -> list[Any]:
    """Each row's prompt: chat messages if verl kept ``raw_prompt``, else its unpadded token ids."""
    if "raw_prompt" in request.non_tensor_batch:
        return [list(messages) for messages in request.non_tensor_batch["raw_prompt"]]
    prompts = request.batch["prompts"]
    prompt_mask = request.batch["attention_mask"][:, : prompts.shape[1]].bool()
    return [prompts[row][prompt_mask[row]].tolist() for row in range(len(request))]


def _responses(request: DataProto) -> list[list[int]]:
    mask = request.batch["response_mask"].bool()
    return [request.batch["responses"][row][mask[row]].tolist() for row in range(len(request))]


def _verifier_rows(request: DataProto, info_keys: Sequence[str]) -> list[list[Any]]:
    columns = [request.non_tensor_batch[key] for key in info_keys]
    return [[column[row] for column in columns] for row in range(len(request))]


def group_constant_tensor(prompts: Sequence[Any], infos: Sequence[Sequence[Any]]) -> torch.Tensor:
    """(bs, K) bool :func:`~mrtpo_verl.replay.contexts.group_constant_flags` of a whole batch, for the request."""
    flags = group_constant_flags(prompts, infos)
    return torch.tensor(flags, dtype=torch.bool).reshape(len(prompts), -1)


def request_group_constant(data: DataProto, info_keys: Sequence[str]) -> torch.Tensor:
    """:func:`group_constant_tensor` of a batch in the request layout (``raw_prompt`` or prompt ids)."""
    return group_constant_tensor(_prompts(data), _verifier_rows(data, info_keys))


def relevance_for_request(
    request: DataProto, builder: ReplayContextBuilder, scorer: ReplayScorer, info_keys: Sequence[str]
) -> DataProto:
    """Build the contexts, replay the needed pairs and answer with relevance and counters.

    Args:
        request: the shard (see the module docstring).
        builder: renders full and leave-one-out contexts.
        scorer: runs the model and reduces to JS distance.
        info_keys: the verifier-information keys, in reward order.

    Returns:
        DataProto with ``mrtpo_relevance`` (bs, K, L) and the counters (bs,) each.
    """
    needed = request.batch[NEEDED_KEY].bool()
    response_length = request.batch["responses"].shape[1]
    rows_needed = needed.any(dim=1)
    prompts, responses, infos = _prompts(request), _responses(request), _verifier_rows(request, info_keys)
    # The order rule's flags over the whole batch when the driver sent them (a DP split may cut a group).
    constant = (
        request.batch[GROUP_CONSTANT_KEY].tolist()
        if GROUP_CONSTANT_KEY in request.batch.keys()  # noqa: SIM118 (TensorDict refuses `in` on itself)
        else group_constant_flags(prompts, infos)
    )
    # Rows with nothing to replay need no contexts either (exact skipping reaches the tokenizer too).
    built = builder.build_batch(
        [prompts[i] for i in range(len(request)) if rows_needed[i]],
        [responses[i] for i in range(len(request)) if rows_needed[i]],
        [infos[i] for i in range(len(request)) if rows_needed[i]],
        [constant[i] for i in range(len(request)) if rows_needed[i]],
    )
    relevance = torch.zeros(len(request), needed.shape[1], response_length)
    # Called even with nothing to score: a sharded (colocated) scorer's passes are collectives, so a rank
    # with no work still has to run the idle passes that keep it in step with the others.
    result = scorer.score(built, needed[rows_needed], response_length=response_length)
    relevance[rows_needed] = result.relevance.float().cpu()
    forward_passes, tokens = result.stats.forward_passes, result.stats.replayed_tokens
    skipped = result.stats.skipped_passes
    # Responses with no needed pair: 1 + K passes each, none run. Rows without response tokens (e.g. the
    # padding a backend adds to split the request evenly) are not responses and count for nothing.
    has_response = request.batch["response_mask"].bool().any(dim=1)
    skipped += int((~rows_needed & has_response).sum()) * (1 + needed.shape[1])
    shared = result.stats.prefix_tokens_shared
    counters = torch.zeros(5, len(request), dtype=torch.float64)
    if len(request):
        counters[:, 0] = torch.tensor(
            [forward_passes, skipped, tokens, count_truncated_verifiers(built), shared], dtype=torch.float64
        )
    return DataProto.from_dict(
        tensors={
            RELEVANCE_KEY: relevance,
            "mrtpo_forward_passes": counters[0],
            "mrtpo_skipped_passes": counters[1],
            "mrtpo_tokens_replayed": counters[2],
            "mrtpo_truncated_contexts": counters[3],
            "mrtpo_prefix_tokens_shared": counters[4],
        }
    )

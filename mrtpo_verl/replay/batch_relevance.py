"""Relevance for one replay request (a ``DataProto`` shard): what a replay worker runs.

Shared by every placement (a Ray worker, the actor's own processes, or in-process), so they all
compute the same thing. The request layout is :func:`mrtpo_verl.trainer.replay_stage.build_request`'s,
which is verl's rollout layout (single-turn and agent-loop alike):

- batch ``prompts`` (bs, P), left-padded, with ``attention_mask`` (bs, P + L) marking each prompt's own tokens
  and each response's tokens; ``responses`` (bs, L), right-padded; ``response_mask`` (bs, L), 1 on the tokens
  the policy generated and 0 on padding and, in a multi-turn (tool agent) response, on the tool outputs and
  chat-template tokens between the turns; ``mrtpo_needed`` (bs, K) bool and, optionally,
  ``mrtpo_group_constant`` (bs, K) bool (the verifier-order rule's flags over the whole batch);
- non_tensor_batch: one verifier-information array per reward (in reward order).

What is replayed is what the policy saw: the prompt's own token ids (``prompts`` where the attention mask is 1)
and every response token the attention mask covers, tool outputs included. Relevance is computed at each of
those positions and written back to the column of the token it was computed for; columns where
``response_mask`` is 0 (tool outputs, padding) get 0, so they carry no weight.

Rows whose contexts cannot fit ``max_context_tokens`` even with the verifier texts cut to the marker
(:class:`~mrtpo_verl.replay.contexts.ContextOverBudget`) are not replayed: their relevance stays 0, which gives
uniform token weights for that row alone; they are counted in ``mrtpo_rows_unscored`` and logged with the reason.

The answer holds ``mrtpo_relevance`` (bs, K, L) float32 and counters as (bs,) tensors whose sums
are the shard's totals (row 0 carries them), so that verl's DP collect can simply concatenate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from verl.protocol import DataProto

from mrtpo_verl.batch_keys import COUNTER_KEYS, GROUP_CONSTANT_KEY, NEEDED_KEY, RELEVANCE_KEY
from mrtpo_verl.replay.contexts import (
    ContextOverBudget,
    ReplayContextBuilder,
    ReplayContexts,
    count_truncated_verifiers,
    group_constant_flags,
)
from mrtpo_verl.replay.scorer import ReplayScorer

__all__ = ["ContextMismatch", "context_mismatches", "relevance_for_request", "replayed_response_columns"]

logger = logging.getLogger(__name__)


def _prompts(request: DataProto) -> list[list[int]]:
    """Each row's prompt token ids without padding: exactly the tokens the rollout fed the policy."""
    prompts = request.batch["prompts"]
    prompt_mask = _attention_mask(request)[:, : prompts.shape[1]].bool()
    return [prompts[row][prompt_mask[row]].tolist() for row in range(len(request))]


def _attention_mask(request: DataProto) -> torch.Tensor:
    """(bs, P + L) attention mask, checked against the prompt and response widths."""
    mask = request.batch["attention_mask"]
    width = request.batch["prompts"].shape[1] + request.batch["responses"].shape[1]
    if mask.dim() != 2 or mask.shape[1] != width:
        raise ValueError(
            f"replay request: attention_mask {tuple(mask.shape)} does not cover prompts + responses "
            f"({request.batch['prompts'].shape[1]} + {request.batch['responses'].shape[1]} columns)"
        )
    return mask


def replayed_response_columns(request: DataProto) -> list[torch.Tensor]:
    """Per row, the response columns replayed: every token the attention mask covers, in order.

    In verl's agent-loop layout these are the generated tokens *and* the tool outputs between turns (the policy
    saw both); ``response_mask`` marks only the generated ones.

    Returns:
        bs long tensors of column indices into ``responses``.
    """
    response_attention = _attention_mask(request)[:, request.batch["prompts"].shape[1] :].bool()
    return [response_attention[row].nonzero().flatten() for row in range(len(request))]


@dataclass(frozen=True)
class ContextMismatch:
    """A row whose replayed response tokens are not the ones the rollout produced for the policy."""

    row: int
    replayed_tokens: int
    stored_tokens: int
    #: First response position (0-based, in the stored response) where the ids differ; None if only the counts do.
    first_different_position: int | None

    def describe(self) -> str:
        position = self.first_different_position
        where = "" if position is None else f", ids differ from position {position}"
        return f"row {self.row}: {self.replayed_tokens} response tokens replayed, {self.stored_tokens} stored{where}"


def context_mismatches(
    request: DataProto, stored_ids: Sequence[torch.Tensor], stored_lengths: Sequence[int | None] | None = None
) -> list[ContextMismatch]:
    """Rows whose replayed response tokens (count and ids) differ from the ones the rollout stored.

    What is replayed is read exactly as the replay reads it (:func:`replayed_response_columns` on the request's
    ``attention_mask`` and ``responses``); it is compared with a record kept apart from that mask: each row's
    response ids as the rollout stored them (``stored_ids``, unpadded) and, where given, the response length the
    rollout recorded for the row (``stored_lengths``, None for a row without one).

    Args:
        request: a batch in the request layout (module docstring).
        stored_ids: bs 1-D tensors, each row's response token ids without padding.
        stored_lengths: bs response lengths (or None per row), or None for none.

    Returns:
        One :class:`ContextMismatch` per row that differs, in row order (empty when every row matches).
    """
    if len(stored_ids) != len(request) or (stored_lengths is not None and len(stored_lengths) != len(request)):
        raise ValueError(
            f"context check: {len(stored_ids)} stored responses (and {len(stored_lengths or [])} lengths) "
            f"for a batch of {len(request)} rows"
        )
    columns = replayed_response_columns(request)
    replayed = _responses(request, columns)
    mismatches = []
    for row, (tokens, stored) in enumerate(zip(replayed, stored_ids, strict=True)):
        stored = stored.tolist()
        length = len(stored) if stored_lengths is None or stored_lengths[row] is None else stored_lengths[row]
        if tokens == stored and len(tokens) == length:
            continue
        different = next((i for i, (a, b) in enumerate(zip(tokens, stored, strict=False)) if a != b), None)
        mismatches.append(ContextMismatch(row, len(tokens), length, different))
    return mismatches


def _responses(request: DataProto, columns: Sequence[torch.Tensor]) -> list[list[int]]:
    return [request.batch["responses"][row][columns[row]].tolist() for row in range(len(request))]


def _verifier_rows(request: DataProto, info_keys: Sequence[str]) -> list[list[Any]]:
    columns = [request.non_tensor_batch[key] for key in info_keys]
    return [[column[row] for column in columns] for row in range(len(request))]


def group_constant_tensor(prompts: Sequence[Any], infos: Sequence[Sequence[Any]]) -> torch.Tensor:
    """(bs, K) bool :func:`~mrtpo_verl.replay.contexts.group_constant_flags` of a whole batch, for the request."""
    flags = group_constant_flags(prompts, infos)
    return torch.tensor(flags, dtype=torch.bool).reshape(len(prompts), -1)


def request_group_constant(data: DataProto, info_keys: Sequence[str]) -> torch.Tensor:
    """:func:`group_constant_tensor` of a batch in the request layout (rows grouped by their prompt ids)."""
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
        DataProto with ``mrtpo_relevance`` (bs, K, L), 0 where ``response_mask`` is 0, and the counters (bs,) each.
    """
    needed = request.batch[NEEDED_KEY].bool()
    response_mask = request.batch["response_mask"].bool()
    response_length = request.batch["responses"].shape[1]
    columns = replayed_response_columns(request)
    prompts, responses, infos = _prompts(request), _responses(request, columns), _verifier_rows(request, info_keys)
    # The order rule's flags over the whole batch when the driver sent them (a DP split may cut a group).
    constant = (
        request.batch[GROUP_CONSTANT_KEY].tolist()
        if GROUP_CONSTANT_KEY in request.batch.keys()  # noqa: SIM118 (TensorDict refuses `in` on itself)
        else group_constant_flags(prompts, infos)
    )
    # Rows with nothing to replay need no contexts either (exact skipping reaches the tokenizer too).
    rows, built, unscored = [], [], 0
    for row in needed.any(dim=1).nonzero().flatten().tolist():
        contexts = _build_row(builder, row, prompts[row], responses[row], infos[row], constant[row])
        if contexts is None:
            unscored += 1
            continue
        rows.append(row)
        built.append(contexts)
    # Called even with nothing to score: a sharded (colocated) scorer's passes are collectives, so a rank
    # with no work still has to run the idle passes that keep it in step with the others.
    result = scorer.score(built, needed[rows], response_length=response_length)
    relevance = torch.zeros(len(request), needed.shape[1], response_length)
    scored = result.relevance.float().cpu()  # one device-to-host copy for the whole request
    for index, row in enumerate(rows):
        # The scorer fills the first T columns of its output, T = tokens replayed; they go back to theirs.
        relevance[row][:, columns[row]] = scored[index, :, : len(columns[row])]
    relevance *= response_mask[:, None, :]
    counts = [
        result.stats.forward_passes,
        result.stats.skipped_passes + _passes_of_rows_not_needed(needed, response_mask),
        result.stats.replayed_tokens,
        count_truncated_verifiers(built),
        result.stats.prefix_tokens_shared,
        unscored,
    ]
    counters = torch.zeros(len(COUNTER_KEYS), len(request), dtype=torch.float64)
    if len(request):
        counters[:, 0] = torch.tensor(counts, dtype=torch.float64)
    return DataProto.from_dict(tensors={RELEVANCE_KEY: relevance} | dict(zip(COUNTER_KEYS, counters, strict=True)))


def _build_row(
    builder: ReplayContextBuilder,
    row: int,
    prompt: list[int],
    response: list[int],
    info: Sequence[Any],
    constant: Sequence[bool],
) -> ReplayContexts | None:
    """The row's contexts, or None (with a warning) when they cannot fit the token budget."""
    try:
        return builder.build(prompt, response, info, constant)
    except ContextOverBudget as error:
        logger.warning(
            "mrtpo replay: row %d (%d prompt + %d response tokens) is not replayed and gets uniform token weights "
            "this step: %s",
            row,
            len(prompt),
            len(response),
            error,
        )
        return None


def _passes_of_rows_not_needed(needed: torch.Tensor, response_mask: torch.Tensor) -> int:
    """1 + K passes skipped exactly per response with no needed pair (unscored rows are not skips).

    Rows without response tokens (e.g. the padding a backend adds to split the request evenly) are not
    responses and count for nothing.
    """
    return int((~needed.any(dim=1) & response_mask.any(dim=1)).sum()) * (1 + needed.shape[1])

"""Replay cost on the paper's task families with prefix sharing, rows for ``benchmarks.replay_cost``.

Per family: one real prompt of the shipped data (the demo's: Spider with its schema prompt, BFCL v4 with its
function documentation, IFEval), n responses sampled by SmolLM2-135M-Instruct itself (temperature 0.8), each
scored by the family's real reward function, whose verifier texts (all K of them) make the contexts. Every
(response, reward) pair is replayed (exact skipping off: the worst case). Timed interleaved, one after the
other in every repeat:

- the replay stage with prefix sharing (``share_prefix=True``, ``min_shared_tokens`` = the config default 1: the
  deepest tree, and = 16: fewer, larger forward calls for more tokens),
- the replay stage without (every context from its first token),
- verl's old-log-prob pass over the same n responses after their prompts (full logits + ``logprobs_from_logits``,
  one unpadded sequence at a time, as in the other rows of ``replay_cost``).

Tokens: replayed by each, fed by verl's pass, and the structure's floor — every distinct context prefix once
plus each pass's response (:func:`~mrtpo_verl.replay.prefix_tree.distinct_prefix_tokens`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.machine import Row, milliseconds, time_interleaved
from benchmarks.verl_reference import verl_old_log_probs
from mrtpo_verl.config import ReplayConfig
from mrtpo_verl.replay.contexts import ReplayContextBuilder
from mrtpo_verl.replay.prefix_tree import distinct_prefix_tokens
from mrtpo_verl.replay.scorer import ReplayScorer, _plan_passes


@dataclasses.dataclass(frozen=True)
class FamilyBatch:
    """One group: the prompt's token ids, n responses and the verifier texts the reward function returned."""

    task: str
    prompt: list[dict[str, str]]
    prompt_ids: list[int]
    responses: list[list[int]]
    infos: list[list[str]]
    reward_keys: tuple[str, ...]


def family_batch(model: Any, tokenizer: Any, task: str, samples: int, max_new_tokens: int, seed: int) -> FamilyBatch:
    """``samples`` SmolLM2 responses to the family's first demo prompt, scored by its reward function."""
    from mrtpo_verl.demo.batch import sample_group
    from mrtpo_verl.demo.tasks import load_prompts
    from reward_fns import dispatch

    torch.manual_seed(seed)
    prompt = load_prompts(task, 1)[0]
    keys = dispatch.reward_keys([task])
    group = sample_group(model, tokenizer, prompt, 0, samples, max_new_tokens, 0.8, False, [task])
    return FamilyBatch(
        task,
        prompt.messages,
        group[0].prompt_ids,
        [response.response_ids for response in group],
        [[response.scores[dispatch.info_key(key)] for key in keys] for response in group],
        keys,
    )


def family_rows(
    model: Any, tokenizer: Any, tasks: list[str], samples: int, max_new_tokens: int, repeats: int
) -> list[Row]:
    rows = []
    for task in tasks:
        rows += _measure_family(
            model, family_batch(model, tokenizer, task, samples, max_new_tokens, 0), tokenizer, repeats
        )
    return rows


def _measure_family(model: Any, batch: FamilyBatch, tokenizer: Any, repeats: int) -> list[Row]:

    samples = len(batch.responses)
    builder = ReplayContextBuilder(tokenizer, batch.reward_keys, max_context_tokens=8192)
    needed = torch.ones(samples, len(batch.reward_keys), dtype=torch.bool)
    scorers = {
        f"shared (min_shared_tokens={ReplayConfig.min_shared_tokens}, default)": ReplayScorer(model),
        "shared (min_shared_tokens=16)": ReplayScorer(model, share_prefix=True, min_shared_tokens=16),
        "unshared": ReplayScorer(model, share_prefix=False),
    }
    stats: dict[str, Any] = {}

    def stage(name: str, scorer: ReplayScorer) -> None:
        built = builder.build_batch([batch.prompt] * samples, batch.responses, batch.infos)
        stats[name] = scorer.score(built, needed).stats

    sequences = [torch.tensor([[*batch.prompt_ids, *response]]) for response in batch.responses]

    def old_log_probs() -> None:
        for input_ids, response in zip(sequences, batch.responses, strict=True):
            verl_old_log_probs(model, input_ids, len(response))

    functions: dict[str, Callable[[], object]] = {
        name: (lambda name=name, scorer=scorer: stage(name, scorer)) for name, scorer in scorers.items()
    }
    functions["verl"] = old_log_probs
    median = time_interleaved(functions, repeats, warm_up=False)
    items = builder.build_batch([batch.prompt] * samples, batch.responses, batch.infos)
    verl_tokens = sum(sequence.shape[1] for sequence in sequences)
    floor = distinct_prefix_tokens(_plan_passes(items, needed)[0])
    return _rows_of_family(batch, stats, median, verl_tokens, floor)


def _rows_of_family(
    batch: FamilyBatch,
    stats: dict[str, Any],
    median: dict[str, float],
    verl_tokens: int,
    floor: int,
) -> list[Row]:
    n, k = len(batch.responses), len(batch.reward_keys)
    response_tokens = sum(len(r) for r in batch.responses)
    setting = (
        f"{batch.task}: 1 prompt ({len(batch.prompt_ids)} tokens) x {n} SmolLM2 responses "
        f"({response_tokens / n:.0f} tokens avg), K={k}, every pair replayed"
    )
    rows = [
        Row(
            f"family {batch.task}",
            f"{setting}; structure's floor {floor:,} tokens = {floor / verl_tokens:.2f}x verl's",
            f"{floor:,} tokens (floor)",
            f"{verl_tokens:,} tokens",
            "verl old log-probs: tokens fed",
            f"{floor / verl_tokens:.2f}x tokens",
        )
    ]
    for name, figures in stats.items():
        rows.append(
            Row(
                f"  replay stage, {name}",
                f"{figures.replayed_tokens:,} tokens replayed ({figures.replayed_tokens / verl_tokens:.2f}x verl's, "
                f"{figures.replayed_tokens / floor:.2f}x floor), {figures.model_calls} model calls, "
                f"{figures.prefix_tokens_shared:,} tokens shared, "
                f"peak cache {figures.peak_cache_bytes / 2**20:.0f} MiB",
                milliseconds(median[name]),
                milliseconds(median["verl"]),
                "verl old log-probs, same batch",
                f"{median[name] / median['verl']:.2f}x",
            )
        )
    return rows

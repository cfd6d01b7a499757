"""ReplayScorer on the real SmolLM2-135M-Instruct against a naive float64 reference.

The reference materialises everything: one unpadded forward pass per whole sequence, the full
(seq × vocab) logits, a float64 log-softmax at the response positions and the JS distance written out in
float64 with log2. Contexts are real Spider prompts with verifier-like information; responses are the
model's own greedy generations.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mrtpo_verl.config import DEFAULT_MAX_CACHE_BYTES, ReplayConfig
from mrtpo_verl.replay.contexts import ReplayContexts
from mrtpo_verl.replay.float32_compute import float32_compute
from mrtpo_verl.replay.model_runners import LocalModelRunner
from mrtpo_verl.replay.scorer import ReplayResult, ReplayScorer, cache_bytes_per_token

pytestmark = pytest.mark.slow
JS_CHUNK = 5  # < the 16-token responses, so every response spans several LM-head chunks, the last one partial


def reference_logits(model: Any, context: Sequence[int], response: Sequence[int]) -> torch.Tensor:
    """(T, vocab) float64 logits predicting each response token, from one whole-sequence forward pass."""
    input_ids = torch.tensor([[*context, *response]])
    with torch.inference_mode():
        logits = model(input_ids=input_ids).logits[0].double()  # (seq, vocab): everything materialised
    return logits[len(context) - 1 : len(context) + len(response) - 1]


def reference_js_distance(logits_p: torch.Tensor, logits_q: torch.Tensor, temperature: float) -> torch.Tensor:
    """(T,) sqrt(½ Σ P log2(P/M) + ½ Σ Q log2(Q/M)), M = (P + Q) / 2, P and Q at temperature τ, all float64."""
    log2_p = torch.log_softmax(logits_p / temperature, dim=-1) / math.log(2.0)
    log2_q = torch.log_softmax(logits_q / temperature, dim=-1) / math.log(2.0)
    p, q = torch.exp2(log2_p), torch.exp2(log2_q)
    log2_m = torch.log2(0.5 * (p + q))
    divergence = 0.5 * (p * (log2_p - log2_m)).sum(-1) + 0.5 * (q * (log2_q - log2_m)).sum(-1)
    return divergence.clamp(min=0).sqrt()


@dataclass(frozen=True)
class Reference:
    """Reference logits of every context of every item, computed once and reused at any temperature."""

    full: list[torch.Tensor]  # per item, (T, vocab) float64
    leave_one_out: list[list[torch.Tensor]]  # per item and reward, (T, vocab) float64

    def relevance(self, needed: torch.Tensor, temperature: float, length: int) -> torch.Tensor:
        """(bs, K, length) float64 relevance, one pair at a time."""
        relevance = torch.zeros(*needed.shape, length, dtype=torch.float64)
        for i, full in enumerate(self.full):
            for k in needed[i].nonzero().flatten().tolist():
                distance = reference_js_distance(full, self.leave_one_out[i][k], temperature)
                relevance[i, k, : full.shape[0]] = distance
        return relevance


@pytest.fixture(scope="module")
def model(smollm2: tuple[Any, Any]) -> Any:
    return smollm2[0]


@pytest.fixture(scope="module")
def all_needed(replay_items: list[ReplayContexts]) -> torch.Tensor:
    return torch.ones(len(replay_items), 3, dtype=torch.bool)


@pytest.fixture(scope="module")
def baseline(model: Any, replay_items: list[ReplayContexts], all_needed: torch.Tensor) -> ReplayResult:
    """Right padding, micro-batch 2, τ = 1, no prefix sharing: the run every other configuration is compared with."""
    scorer = ReplayScorer(model, js_chunk_size=JS_CHUNK, micro_batch_size=2, share_prefix=False)
    return scorer.score(replay_items, all_needed)


@pytest.fixture(scope="module")
def reference(model: Any, replay_items: list[ReplayContexts]) -> Reference:
    full, leave_one_out = [], []
    for item in replay_items:
        full.append(reference_logits(model, item.full_context_ids, item.response_ids))
        leave_one_out.append(
            [
                full[-1] if context == item.full_context_ids else reference_logits(model, context, item.response_ids)
                for context in item.leave_one_out_ids
            ]
        )
    return Reference(full=full, leave_one_out=leave_one_out)


@contextmanager
def recorded_calls(module: torch.nn.Module) -> Iterator[list[tuple[int, ...]]]:
    """Shapes of the first positional/keyword tensor input of every call of ``module``."""
    shapes: list[tuple[int, ...]] = []

    def record(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        first = args[0] if args else kwargs["input_ids"]
        shapes.append(tuple(first.shape))

    handle = module.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield shapes
    finally:
        handle.remove()


def test_responses_are_real_and_of_unequal_length(replay_items: list[ReplayContexts]) -> None:
    lengths = [len(item.response_ids) for item in replay_items]
    assert all(0 < n <= 16 for n in lengths)
    assert len({len(item.full_context_ids) for item in replay_items}) == 2  # unequal contexts: padding matters


def test_matches_float64_reference(
    baseline: ReplayResult, reference: Reference, replay_items: list[ReplayContexts], all_needed: torch.Tensor
) -> None:
    got = baseline.relevance
    expected = reference.relevance(all_needed, temperature=1.0, length=got.shape[-1])
    assert got.dtype == torch.float32 and got.shape == expected.shape
    error = (got.double() - expected).abs().max().item()
    print(f"max |q - q_ref| at τ=1: {error:.2e}")
    assert error < 1e-4
    assert expected.max() > 0.05  # the verifier information really moves the distribution
    for i, item in enumerate(replay_items):  # 0 at padding
        assert (got[i, :, len(item.response_ids) :] == 0).all()


def test_identical_context_is_exactly_zero_without_a_pass(
    baseline: ReplayResult, replay_items: list[ReplayContexts]
) -> None:
    assert replay_items[1].identical_to_full == (False, True, False)
    assert (baseline.relevance[1, 1] == 0).all()
    assert (baseline.relevance[1, 0] > 0).any() and (baseline.relevance[1, 2] > 0).any()
    assert baseline.stats.identical_contexts == 1
    assert baseline.stats.forward_passes == 4 + 3
    assert baseline.stats.skipped_passes == 1


@pytest.mark.parametrize(
    ("padding_side", "micro_batch_size"),
    [("right", 1), ("left", 3)],  # vs the baseline's ("right", 2)
)
def test_padding_side_and_micro_batch_size_do_not_change_q(
    model: Any,
    replay_items: list[ReplayContexts],
    all_needed: torch.Tensor,
    baseline: ReplayResult,
    padding_side: str,
    micro_batch_size: int,
) -> None:
    scorer = ReplayScorer(model, js_chunk_size=JS_CHUNK, micro_batch_size=micro_batch_size, padding_side=padding_side)
    result = scorer.score(replay_items, all_needed)
    torch.testing.assert_close(result.relevance, baseline.relevance, atol=1e-5, rtol=0)
    if micro_batch_size > 1:
        assert result.stats.padded_tokens > 0  # unequal lengths really were padded


def test_token_budget_splits_micro_batches_without_changing_q(
    model: Any, replay_items: list[ReplayContexts], all_needed: torch.Tensor, baseline: ReplayResult
) -> None:
    longest = max(len(item.full_context_ids) + len(item.response_ids) for item in replay_items)
    budget = 2 * longest + 1  # room for two sequences of any length, never three
    scorer = ReplayScorer(
        model, js_chunk_size=JS_CHUNK, micro_batch_size=8, max_tokens_per_micro_batch=budget, share_prefix=False
    )
    with recorded_calls(scorer.runner.decoder) as decoder_inputs:
        result = scorer.score(replay_items, all_needed)
    torch.testing.assert_close(result.relevance, baseline.relevance, atol=1e-5, rtol=0)
    assert all(rows * length <= budget for rows, length in decoder_inputs)
    assert sum(rows for rows, _ in decoder_inputs) == result.stats.forward_passes
    assert len(decoder_inputs) > math.ceil(result.stats.forward_passes / 8)  # the budget, not the count, split them

    alone = ReplayScorer(
        model, js_chunk_size=JS_CHUNK, micro_batch_size=8, max_tokens_per_micro_batch=1, share_prefix=False
    )
    with recorded_calls(alone.runner.decoder) as decoder_inputs:
        result = alone.score(replay_items, all_needed)
    torch.testing.assert_close(result.relevance, baseline.relevance, atol=1e-5, rtol=0)
    assert {rows for rows, _ in decoder_inputs} == {1} and result.stats.padded_tokens == 0  # over budget: alone


def test_skipping_gives_the_same_q_on_needed_pairs(
    model: Any, replay_items: list[ReplayContexts], baseline: ReplayResult
) -> None:
    needed = torch.tensor([[True, False, True], [False, True, False]])
    scorer = ReplayScorer(model, js_chunk_size=JS_CHUNK, micro_batch_size=2, share_prefix=False)
    with recorded_calls(scorer.runner.decoder) as decoder_inputs:
        result = scorer.score(replay_items, needed)

    torch.testing.assert_close(result.relevance[needed], baseline.relevance[needed], atol=1e-5, rtol=0)
    assert (result.relevance[~needed] == 0).all()
    # Response 0: full + 2 leave-one-outs. Response 1: its only needed context ('executable') equals the full
    # one, so q = 0 and nothing is run, not even the full context.
    assert result.stats.forward_passes == 3 + 0
    assert sum(shape[0] for shape in decoder_inputs) == result.stats.forward_passes
    assert result.stats.skipped_passes == 2 * 4 - 3
    assert result.stats.identical_contexts == 1
    assert result.stats.forward_passes < baseline.stats.forward_passes
    assert result.stats.replayed_tokens < baseline.stats.replayed_tokens


def test_nothing_needed_runs_no_pass(model: Any, replay_items: list[ReplayContexts]) -> None:
    scorer = ReplayScorer(model, js_chunk_size=JS_CHUNK)
    with recorded_calls(scorer.runner.decoder) as decoder_inputs:
        result = scorer.score(replay_items, torch.zeros(2, 3, dtype=torch.bool), response_length=20)
    assert decoder_inputs == [] and result.stats.forward_passes == 0 and result.stats.skipped_passes == 8
    assert result.relevance.shape == (2, 3, 20) and (result.relevance == 0).all()


def test_lm_head_sees_only_response_positions_in_chunks(
    model: Any, replay_items: list[ReplayContexts], all_needed: torch.Tensor
) -> None:
    item = replay_items[0]
    scorer = ReplayScorer(model, js_chunk_size=JS_CHUNK, micro_batch_size=3, share_prefix=False)
    with recorded_calls(scorer.runner.lm_head) as lm_head_inputs:
        result = scorer.score([item], torch.tensor([[False, True, False]]), response_length=len(item.response_ids) + 7)
    response_length = len(item.response_ids)
    assert (result.relevance[0, 1, :response_length] > 0).any()
    assert (result.relevance[0, :, response_length:] == 0).all()  # padding past the response stays 0
    # Per chunk of response positions: the full context's rows once, then the 'executable' leave-one-out's.
    chunk_sizes = [min(JS_CHUNK, response_length - first) for first in range(0, response_length, JS_CHUNK)]
    assert [shape[0] for shape in lm_head_inputs] == [size for size in chunk_sizes for _ in range(2)]
    assert all(len(shape) == 2 for shape in lm_head_inputs)
    expected_tokens = len(item.full_context_ids) + len(item.leave_one_out_ids[1]) + 2 * response_length
    assert result.stats.replayed_tokens == expected_tokens


def test_temperature_changes_q_and_matches_the_reference(
    model: Any,
    replay_items: list[ReplayContexts],
    all_needed: torch.Tensor,
    baseline: ReplayResult,
    reference: Reference,
) -> None:
    scorer = ReplayScorer(model, js_chunk_size=JS_CHUNK, micro_batch_size=2, temperature=0.7)
    result = scorer.score(replay_items, all_needed)
    assert (result.relevance - baseline.relevance).abs().max() > 1e-2
    expected = reference.relevance(all_needed, temperature=0.7, length=result.relevance.shape[-1])
    error = (result.relevance.double() - expected).abs().max().item()
    print(f"max |q - q_ref| at τ=0.7: {error:.2e}")
    assert error < 1e-4


def test_training_mode_is_restored_and_no_grad_is_kept(model: Any, replay_items: list[ReplayContexts]) -> None:
    model.train()
    try:
        result = ReplayScorer(model, js_chunk_size=JS_CHUNK).score(
            replay_items[:1], torch.tensor([[True, False, False]])
        )
        assert model.training
        assert not result.relevance.requires_grad
    finally:
        model.eval()


def test_from_config_and_input_validation(model: Any, replay_items: list[ReplayContexts]) -> None:
    replay = ReplayConfig(
        js_chunk_size=7,
        micro_batch_size=5,
        temperature=0.9,
        share_prefix=False,
        min_shared_tokens=3,
        max_cache_tokens=9,
    )
    scorer = ReplayScorer.from_config(model, replay, padding_side="left")
    assert (scorer.js_chunk_size, scorer.micro_batch_size, scorer.temperature, scorer.padding_side) == (
        7,
        5,
        0.9,
        "left",
    )
    assert (scorer.share_prefix, scorer.min_shared_tokens, scorer.max_cache_tokens) == (False, 3, 9)
    with pytest.raises(ValueError, match="bool tensor"):
        scorer.score(replay_items, torch.ones(2, 3))
    with pytest.raises(ValueError, match="bool tensor"):
        scorer.score(replay_items, torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="leave-one-out contexts, expected 2"):
        scorer.score(replay_items, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="response_length=2"):
        scorer.score(replay_items, torch.ones(2, 3, dtype=torch.bool), response_length=2)
    with pytest.raises(ValueError, match="padding_side"):
        ReplayScorer(model, padding_side="middle")
    with pytest.raises(ValueError, match="max_cache_tokens must be ≥ 1"):
        ReplayScorer(model, max_cache_tokens=0)


def measured_cache_bytes_per_token(model: Any, tokens: int = 5) -> float:
    """Bytes per token of a real key/value cache the model builds over ``tokens`` tokens."""
    ids = torch.arange(10, 10 + tokens)[None]
    with torch.no_grad():
        cache = LocalModelRunner(model).prefix_cache(ids, torch.ones_like(ids), torch.arange(tokens)[None])
    return cache.nbytes / cache.length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_per_token_is_what_a_real_cache_holds(model: Any, dtype: torch.dtype) -> None:
    typed = model if dtype == torch.float32 else copy.deepcopy(model).to(dtype)
    per_token = cache_bytes_per_token(typed.config, dtype)
    assert per_token == measured_cache_bytes_per_token(typed)
    # computed in the model's dtype: the default byte budget, turned into tokens for this model and dtype
    scorer = ReplayScorer(typed, compute_dtype="model")
    assert scorer.max_cache_tokens == DEFAULT_MAX_CACHE_BYTES // per_token
    assert ReplayScorer(typed, max_cache_bytes=10 * per_token + 1, compute_dtype="model").max_cache_tokens == 10
    # computed in float32 (the default), whatever the weights: float32 keys and values
    with float32_compute("cpu"):
        assert measured_cache_bytes_per_token(typed) == cache_bytes_per_token(typed.config, torch.float32)
    assert ReplayScorer(typed).max_cache_tokens == DEFAULT_MAX_CACHE_BYTES // cache_bytes_per_token(
        typed.config, torch.float32
    )


def test_cache_budget_given_in_tokens_or_bytes_not_both(model: Any) -> None:
    assert ReplayScorer(model, max_cache_tokens=300).max_cache_tokens == 300
    assert ReplayScorer(model, max_cache_bytes=1).max_cache_tokens == 1  # at least one token: a row runs alone
    assert ReplayScorer(model, share_prefix=False).max_cache_tokens == 0  # no cache held, no budget
    with pytest.raises(ValueError, match="not both"):
        ReplayScorer(model, max_cache_tokens=300, max_cache_bytes=2**30)
    with pytest.raises(ValueError, match="max_cache_bytes must be ≥ 1"):
        ReplayScorer(model, max_cache_bytes=0)


def test_a_config_without_layer_count_names_the_token_override() -> None:
    with pytest.raises(ValueError, match=r"no num_hidden_layers .*set mrtpo\.replay\.max_cache_tokens"):
        cache_bytes_per_token(SimpleNamespace(num_attention_heads=4, hidden_size=64), torch.bfloat16)

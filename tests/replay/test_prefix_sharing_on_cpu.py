"""Prefix sharing: the shared replay equals the unshared one on the real SmolLM2-135M-Instruct.

Batches are real prompts of the three task families (the demo's: Spider with its schema, BFCL v4 with its
function documentation, IFEval), two prompts of different lengths per family and two short responses per
prompt, with the verifier texts the family's real reward function returns for them. The unshared replay
(``share_prefix=False``: every context from its first token) is the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicCache

from mrtpo_verl.demo.tasks import TASKS, load_prompts
from mrtpo_verl.replay.contexts import ReplayContextBuilder, ReplayContexts, verifier_order
from mrtpo_verl.replay.model_runners import LocalModelRunner, PrefixCache, ShardedModelRunner
from mrtpo_verl.replay.prefix_tree import build_prefix_tree, distinct_prefix_tokens, two_level_tree
from mrtpo_verl.replay.scorer import ReplayResult, ReplayScorer, _Pass
from reward_fns import dispatch

from .conftest import REWARD_KEYS, SpiderPrompt

pytestmark = pytest.mark.slow
RESPONSE_TOKENS = 12
JS_CHUNK = 5
IF_RESPONSES = ("Sure! here is a short answer, all in lowercase.", "NO")


def family_items(tokenizer: Any, task: str) -> list[ReplayContexts]:
    """2 prompts: 2 responses to the first (the reference answer cut short, and a broken one), 1 to the second."""
    keys = dispatch.reward_keys([task])
    builder = ReplayContextBuilder(tokenizer, keys)
    prompts, responses, infos = [], [], []
    for index, prompt in enumerate(load_prompts(task, 2)):
        texts = (prompt.reference[:60], prompt.reference[:9]) if prompt.reference else IF_RESPONSES
        for text in texts[: 2 - index]:
            scores = dispatch.compute_score(prompt.data_source, text, prompt.ground_truth, families=[task])
            prompts.append(prompt.messages)
            responses.append(tokenizer(text, add_special_tokens=False)["input_ids"][:RESPONSE_TOKENS])
            infos.append([scores[dispatch.info_key(key)] for key in keys])
    return builder.build_batch(prompts, responses, infos)


def unshared_tokens(items: list[ReplayContexts], needed: torch.Tensor) -> int:
    """Tokens the unshared replay runs: full context + response, and each needed non-identical leave-one-out's."""
    total = 0
    for item, row in zip(items, needed, strict=True):
        run = [k for k in row.nonzero().flatten().tolist() if not item.identical_to_full[k]]
        if run:
            contexts = [item.full_context_ids, *(item.leave_one_out_ids[k] for k in run)]
            total += sum(len(context) + len(item.response_ids) for context in contexts)
    return total


@contextmanager
def recorded_decoder_calls(decoder: torch.nn.Module) -> Iterator[list[tuple[int, int, int]]]:
    """(rows, new tokens, cached tokens) of every decoder call."""
    calls: list[tuple[int, int, int]] = []

    def record(_: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        past = kwargs.get("past_key_values")
        rows, length = kwargs["input_ids"].shape
        calls.append((rows, length, past.get_seq_length() if past is not None else 0))

    handle = decoder.register_forward_pre_hook(record, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def model(smollm2: tuple[Any, Any]) -> Any:
    return smollm2[0]


@pytest.fixture(scope="module")
def families(smollm2: tuple[Any, Any]) -> dict[str, tuple[list[ReplayContexts], ReplayResult]]:
    """Per family: the items and the unshared reference (right padding, every pair needed)."""
    model, tokenizer = smollm2
    batches = {}
    for task in TASKS:
        items = family_items(tokenizer, task)
        needed = torch.ones(len(items), len(items[0].leave_one_out_ids), dtype=torch.bool)
        reference = ReplayScorer(model, js_chunk_size=JS_CHUNK, micro_batch_size=8, share_prefix=False)
        batches[task] = (items, reference.score(items, needed))
    return batches


def test_family_batches_are_real_groups(families: dict[str, tuple[list[ReplayContexts], ReplayResult]]) -> None:
    for task, (items, reference) in families.items():
        assert len({len(item.full_context_ids) for item in items}) > 1, task  # prompts of different lengths
        assert reference.relevance.max() > 0.05, task  # the verifier texts really move the distribution


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize(
    ("padding_side", "micro_batch_size", "max_tokens", "max_cache_tokens", "min_shared", "skip"),
    [
        ("right", 256, 32768, 65536, 16, False),  # default budgets, shallower tree, every pair needed (skipping off)
        ("left", 2, 96, 700, 1, True),  # tight micro-batch and cache budgets, deepest tree, some pairs skipped
    ],
)
@pytest.mark.parametrize("schedule", ["two_levels", "tree"])
def test_shared_replay_equals_unshared(
    model: Any,
    families: dict[str, tuple[list[ReplayContexts], ReplayResult]],
    task: str,
    padding_side: str,
    micro_batch_size: int,
    max_tokens: int,
    max_cache_tokens: int,
    min_shared: int,
    skip: bool,
    schedule: str,
) -> None:
    items, reference = families[task]
    needed = torch.ones(len(items), len(items[0].leave_one_out_ids), dtype=torch.bool)
    if skip:  # (response, reward) pairs needed in a checkerboard: some responses lose their first leave-one-out
        needed = (torch.arange(needed.numel()).reshape(needed.shape) % 2 == 0) | ~needed
    scorer = ReplayScorer(
        model,
        js_chunk_size=JS_CHUNK,
        micro_batch_size=micro_batch_size,
        padding_side=padding_side,
        max_tokens_per_micro_batch=max_tokens,
        share_prefix=True,
        min_shared_tokens=min_shared,
        max_cache_tokens=max_cache_tokens,
        prefix_schedule=schedule,
    )
    with recorded_decoder_calls(scorer.runner.decoder) as calls:
        result = scorer.score(items, needed)

    error = (result.relevance - reference.relevance)[needed].abs().max().item()
    print(f"{task} {padding_side} {schedule}: max |q_shared - q_unshared| = {error:.1e}; stats {result.stats}")
    assert error < 1e-5
    assert (result.relevance[~needed] == 0).all()
    stats = result.stats
    assert len(calls) == stats.model_calls
    assert stats.replayed_tokens + stats.prefix_tokens_shared == unshared_tokens(items, needed)
    assert stats.prefix_tokens_shared > 0 and stats.replayed_tokens < reference.stats.replayed_tokens
    if not skip:
        assert stats.forward_passes == reference.stats.forward_passes
    if max_cache_tokens < 65536:  # the budgets held: rows × rest, and rows × (cached prefix + rest) for the cache
        assert all(rows * length <= max_tokens for rows, length, _ in calls if rows > 1)
        assert all(rows * (cached + length) <= max_cache_tokens for rows, length, cached in calls if rows > 1)
        assert any(cached for _, _, cached in calls) and stats.peak_cache_bytes > 0


def test_auto_schedule_runs_two_levels_only_where_calls_gather_parameters(
    model: Any, families: dict[str, tuple[list[ReplayContexts], ReplayResult]]
) -> None:
    """``auto``: the whole tree (fewest tokens) in one process; two levels (fewest calls) on a sharded actor.

    A sharded runner needs an FSDP process group; here a local runner that declares its calls gather
    parameters stands in for it, and the class flag of the real one is checked.
    """

    class GatheringRunner(LocalModelRunner):
        calls_gather_parameters = True

    assert ShardedModelRunner.calls_gather_parameters and not LocalModelRunner.calls_gather_parameters
    items, _ = families["text_to_sql"]
    needed = torch.ones(len(items), len(items[0].leave_one_out_ids), dtype=torch.bool)
    runs = {}
    for name, runner in (("local", LocalModelRunner(model)), ("gathering", GatheringRunner(model))):
        scorer = ReplayScorer(runner, js_chunk_size=JS_CHUNK, share_prefix=True, prefix_schedule="auto")
        runs[name] = (scorer.prefix_schedule, scorer.score(items, needed))
    assert runs["local"][0] == "tree" and runs["gathering"][0] == "two_levels"
    local, gathering = runs["local"][1], runs["gathering"][1]
    assert gathering.stats.model_calls < local.stats.model_calls
    assert local.stats.replayed_tokens < gathering.stats.replayed_tokens
    assert (local.relevance - gathering.relevance).abs().max().item() < 1e-5


def test_truncated_verifier_texts_share_exactly(
    smollm2: tuple[Any, Any], spider_prompts: list[SpiderPrompt], generated_responses: list[list[int]]
) -> None:
    model, tokenizer = smollm2
    long_info = " ".join(f"row{i}" for i in range(60))
    prompts = [spider_prompts[0].messages] * 2 + [spider_prompts[1].messages]
    infos = [[spider_prompts[0].verifier_info[0], long_info, spider_prompts[0].verifier_info[2]]] * 2 + [
        [spider_prompts[1].verifier_info[0], long_info, None]
    ]
    responses = [generated_responses[0][:8], generated_responses[0][:5], generated_responses[1][:8]]
    untruncated = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=100_000)
    longest = max(len(item.full_context_ids) for item in untruncated.build_batch(prompts, responses, infos))
    builder = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=longest - 40)
    items = builder.build_batch(prompts, responses, infos)
    assert all(item.truncated[1] for item in items)
    needed = torch.ones(3, 3, dtype=torch.bool)
    unshared = ReplayScorer(model, js_chunk_size=JS_CHUNK, share_prefix=False).score(items, needed)
    shared = ReplayScorer(model, js_chunk_size=JS_CHUNK, padding_side="left", micro_batch_size=3).score(items, needed)
    torch.testing.assert_close(shared.relevance, unshared.relevance, atol=1e-5, rtol=0)
    assert shared.stats.replayed_tokens < unshared.stats.replayed_tokens / 2


def test_group_constant_texts_come_first_longest_first(tokenizer_and_prompt: tuple[Any, SpiderPrompt]) -> None:
    tokenizer, prompt = tokenizer_and_prompt
    builder = ReplayContextBuilder(tokenizer, REWARD_KEYS)
    infos = [
        ["same format", "varying A", "same gold, a longer text"],
        ["same format", "varying B!", " same gold, a longer text "],
    ]
    items = builder.build_batch([prompt.messages] * 2, [[100], [200]], infos)
    text = tokenizer.decode(list(items[1].full_context_ids))
    assert text.index("[correct]") < text.index("[format]") < text.index("[executable]")
    # The leave-one-out of the first text keeps the others' order; the full context shares everything before k.
    assert verifier_order(["a", None, "ccc", "bb"], [False, True, False, True]) == [3, 2, 0]
    assert verifier_order(["a", "bb", "bb"]) == [1, 2, 0]
    with pytest.raises(ValueError, match="2 group-constant flags for 3"):
        verifier_order(["a", "b", "c"], [True, False])


@pytest.fixture
def tokenizer_and_prompt(smollm2: tuple[Any, Any], spider_prompts: list[SpiderPrompt]) -> tuple[Any, SpiderPrompt]:
    return smollm2[1], spider_prompts[0]


def test_cache_that_cannot_be_reused_is_refused() -> None:
    keys = torch.zeros(1, 2, 5, 4)
    sliding = DynamicCache(ddp_cache_data=[(keys, keys, torch.tensor([4]))])
    with pytest.raises(NotImplementedError, match="share_prefix=false"):
        PrefixCache.from_cache(sliding)
    plain = PrefixCache.from_cache(DynamicCache(ddp_cache_data=[(keys, keys)]))
    assert plain.length == 5 and plain.nbytes == 2 * keys.nbytes
    repeated = plain.repeated(3)
    assert repeated.layers[0].keys.shape == (3, 2, 5, 4)
    repeated.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4), 0)
    assert plain.length == 5  # the shared prefix never grows


sequences = st.lists(st.integers(0, 3), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(contexts=st.lists(sequences, min_size=1, max_size=12), min_shared=st.integers(1, 4))
def test_prefix_tree_runs_every_pass_once_on_its_own_tokens(contexts: list[list[int]], min_shared: int) -> None:
    passes = [_Pass(i, None, context, [9, 9]) for i, context in enumerate(contexts)]
    tree = build_prefix_tree(passes, min_shared)
    placed = []
    tokens_run = 0
    for node in tree.walk():
        for child in node.children:
            assert child.parent_depth == node.depth and child.depth - node.depth >= min_shared
        tokens_run += len(node.tokens)
        for sequence in node.remainders:
            placed.append(sequence.item)
            assert len(sequence.context) > node.depth  # a remainder starts with a context token
            tokens_run += sequence.length - node.depth
    assert sorted(placed) == list(range(len(passes)))
    for node in tree.walk():  # every pass below a node starts with the node's tokens
        below = [p for n in node.walk() for p in n.remainders]
        assert all(tuple(p.context[node.parent_depth : node.depth]) == node.tokens for p in below)
    bound = distinct_prefix_tokens(passes)
    assert bound <= tokens_run <= sum(p.length for p in passes)
    if min_shared == 1:  # the tree reaches the bound, up to the last token of duplicated contexts
        assert tokens_run <= bound + len(passes)


def tokens_fed(tree: Any) -> int:
    """Tokens a tree's calls feed: every node's own tokens and every remainder after its node's prefix."""
    return sum(len(node.tokens) + sum(p.length - node.depth for p in node.remainders) for node in tree.walk())


def fed_below(node: Any, depth: int, anchors: set[int]) -> int:
    """Tokens the passes below ``node`` feed after their deepest anchor (``depth``: the one above ``node``)."""
    depth = node.depth if id(node) in anchors else depth
    return sum(p.length - depth for p in node.remainders) + sum(fed_below(c, depth, anchors) for c in node.children)


def brute_force_two_level_tokens(tree: Any) -> int:
    """Fewest tokens over every choice of anchors among the tree's nodes (each pass after its deepest anchor)."""
    nodes = tree.walk()[1:]
    best = None
    for mask in range(2 ** len(nodes)):
        anchors = {id(node) for bit, node in enumerate(nodes) if mask >> bit & 1}
        total = sum(node.depth for node in nodes if id(node) in anchors)

        total += sum(p.length for p in tree.remainders) + sum(fed_below(child, 0, anchors) for child in tree.children)
        best = total if best is None else min(best, total)
    return best if best is not None else 0


@settings(max_examples=200, deadline=None)
@given(contexts=st.lists(sequences, min_size=1, max_size=10), min_shared=st.integers(1, 3))
def test_two_level_tree_feeds_the_fewest_tokens_of_any_anchor_choice(
    contexts: list[list[int]], min_shared: int
) -> None:
    passes = [_Pass(i, None, context, [9, 9]) for i, context in enumerate(contexts)]
    tree = build_prefix_tree(passes, min_shared)
    if len(tree.walk()) > 13:  # the brute force tries 2^nodes anchor sets
        return
    two = two_level_tree(tree)
    assert all(child.parent_depth == 0 and not child.children for child in two.children)  # two levels of calls
    assert sorted(p.item for node in two.walk() for p in node.remainders) == list(range(len(passes)))
    for anchor in two.children:  # every pass continues a prefix of its own context, with a token left
        assert anchor.remainders and len(anchor.tokens) == anchor.depth
        assert all(
            tuple(p.context[: anchor.depth]) == anchor.tokens and len(p.context) > anchor.depth
            for p in anchor.remainders
        )
    assert tokens_fed(two) == brute_force_two_level_tokens(tree)
    assert tokens_fed(tree) <= tokens_fed(two) <= sum(p.length for p in passes)

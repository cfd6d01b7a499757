"""The balanced split of a replay request over data-parallel ranks (verl's real DataProto and chunking)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from verl.protocol import DataProto

from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.workers.balanced_split import (
    SPLIT_ABOVE,
    dispatch_balanced,
    grouped_rank_rows,
    prompt_groups,
    restore_row_order,
    row_costs,
)


def request_of(needed: list[list[bool]], prompt_lengths: list[int], response_lengths: list[int]) -> DataProto:
    """A replay request with real layouts: right-padded prompts and responses, a row id to follow rows."""
    rows, prompt_width, response_width = len(needed), max(prompt_lengths), max(response_lengths)
    attention = torch.zeros(rows, prompt_width + response_width, dtype=torch.long)
    response_mask = torch.zeros(rows, response_width, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        attention[row, :p] = 1
        attention[row, prompt_width : prompt_width + r] = 1
        response_mask[row, :r] = 1
    return DataProto.from_dict(
        tensors={
            "prompts": torch.ones(rows, prompt_width, dtype=torch.long),
            "attention_mask": attention,
            "responses": torch.ones(rows, response_width, dtype=torch.long),
            "response_mask": response_mask,
            "mrtpo_needed": torch.tensor(needed, dtype=torch.bool),
            "row": torch.arange(rows),
        }
    )


def test_costs_count_passes_times_tokens() -> None:
    request = request_of([[True, True], [True, False], [False, False]], [3, 5, 4], [2, 1, 6])
    # (1 + 2 needed) x (3 + 2) tokens; (1 + 1) x (5 + 1); nothing needed: 0.
    assert row_costs(request).tolist() == [15, 12, 0]


@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 50)), min_size=1, max_size=12),
    st.integers(1, 6),
)
def test_groups_stay_whole_when_the_balance_allows_and_every_row_lands_once(
    groups_spec: list[tuple[int, int]], ranks: int
) -> None:
    groups, costs = [], []
    for size, cost in groups_spec:  # `size` rows of equal cost per group
        groups.append(list(range(len(costs), len(costs) + size)))
        costs += [cost] * size
    parts = grouped_rank_rows(costs, groups, ranks)
    assert len(parts) == ranks and sorted(row for part in parts for row in part) == list(range(len(costs)))
    loads = [sum(costs[row] for row in part) for part in parts]
    mean = sum(costs) / ranks
    # Balanced within the tolerance, or every unit left is one row (list scheduling: ≤ mean + costliest row).
    assert max(loads) <= SPLIT_ABOVE * mean or max(loads) <= mean + max(costs)
    group_costs = [sum(costs[row] for row in group) for group in groups]
    if max(group_costs) <= (SPLIT_ABOVE - 1) * mean:
        # Whole groups already fit the tolerance (≤ mean + costliest group): no group is cut.
        rank_of = {row: rank for rank, part in enumerate(parts) for row in part}
        assert all(len({rank_of[row] for row in group}) == 1 for group in groups)


def test_each_group_goes_whole_to_one_rank_and_the_loads_balance() -> None:
    # Four groups of four rows (costs 9, 8, 7, 6 per row) on two ranks: 9 + 6 and 8 + 7, no group cut.
    groups = [list(range(g * 4, g * 4 + 4)) for g in range(4)]
    costs = [9] * 4 + [8] * 4 + [7] * 4 + [6] * 4
    parts = grouped_rank_rows(costs, groups, 2)
    assert sorted(parts) == [[0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 8, 9, 10, 11]]


def test_fewer_groups_than_ranks_are_cut_in_halves() -> None:
    # One group of eight rows on four ranks: halves of halves, two rows per rank.
    parts = grouped_rank_rows([5] * 8, [list(range(8))], 4)
    assert sorted(parts) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_groups_without_cost_fill_the_ranks_with_fewest_rows() -> None:
    # Nothing needed anywhere: the groups only balance the rows (the chunks then need no padding).
    parts = grouped_rank_rows([0] * 8, [[0, 1, 2, 3], [4, 5], [6, 7]], 2)
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_groups_are_rows_with_the_same_prompt_ids() -> None:
    request = request_of([[True, True]] * 4, [3, 4, 3, 4], [2, 2, 2, 2])
    request.batch["prompts"][1, 0] = 7  # row 1's prompt differs from row 3's in its first token
    assert prompt_groups(request) == [[0, 2], [1], [3]]


def test_a_rank_with_no_group_gets_padding_rows_only() -> None:
    # One needed group of two and nothing else: it stays whole on one rank, the other gets idle padding.
    request = request_of([[True, True], [True, True]], [4, 4], [3, 3])
    seen: list[DataProto] = []

    def dp_call(padded: DataProto) -> DataProto:
        seen.extend(padded.chunk(2))
        return DataProto.concat([DataProto.from_dict(tensors={"row": c.batch["row"]}) for c in seen])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("mrtpo_verl.workers.balanced_split.SPLIT_ABOVE", 10.0)  # keep the group whole
        answer = dispatch_balanced(request, 2, dp_call)
    assert answer.batch["row"].tolist() == [0, 1]
    assert [c.batch["mrtpo_needed"].any(dim=1).tolist() for c in seen] == [[True, True], [False, False]]


def test_dispatch_pads_with_idle_rows_and_answers_in_request_order() -> None:
    request = request_of([[True, True], [True, True], [True, True]], [4, 4, 4], [3, 3, 3])
    seen_chunks: list[DataProto] = []

    def dp_call(padded: DataProto) -> DataProto:  # what verl's DP dispatch does: equal contiguous chunks
        chunks = padded.chunk(2)
        seen_chunks.extend(chunks)
        return DataProto.concat([DataProto.from_dict(tensors={"row": c.batch["row"]}) for c in chunks])

    answer = dispatch_balanced(request, 2, dp_call)
    assert answer.batch["row"].tolist() == [0, 1, 2]  # padding dropped, request order restored
    padded_rows = torch.cat([c.batch["row"] for c in seen_chunks])
    assert len(padded_rows) == 4
    idle = torch.cat([c.batch["mrtpo_needed"].any(dim=1) == 0 for c in seen_chunks])
    assert int(idle.sum()) == 1  # the one padding row has nothing to replay ...
    empty = torch.cat([c.batch["response_mask"].sum(dim=1) == 0 for c in seen_chunks])
    assert torch.equal(idle, empty)  # ... and no response tokens
    assert [len(c) for c in seen_chunks] == [2, 2]
    assert request.batch["mrtpo_needed"].all() and len(request) == 3  # the caller's request is untouched


@given(st.permutations(list(range(9))))
def test_rows_restored_in_place_match_indexing(order: list[int]) -> None:
    relevance = torch.rand(9, 3, 5)
    counters = torch.arange(9, dtype=torch.float64)
    labels = np.array([f"row {i}" for i in range(9)], dtype=object)
    answer = DataProto.from_dict(tensors={RELEVANCE_KEY: relevance.clone(), "count": counters.clone()})
    answer.non_tensor_batch["label"] = labels.copy()
    storage = answer.batch[RELEVANCE_KEY].data_ptr()
    restore_row_order(answer, order)
    back = torch.argsort(torch.tensor(order))  # what indexing the answer would give, as a copy
    assert torch.equal(answer.batch[RELEVANCE_KEY], relevance[back])
    assert torch.equal(answer.batch["count"], counters[back])
    assert answer.non_tensor_batch["label"].tolist() == labels[back.numpy()].tolist()
    assert answer.batch[RELEVANCE_KEY].data_ptr() == storage  # in place: no second (bs, K, L) tensor


def test_restore_refuses_an_order_that_is_not_a_permutation() -> None:
    answer = DataProto.from_dict(tensors={"count": torch.zeros(3)})
    for order in ([0, 1], [0, 1, 1], [0, 1, 3]):
        with pytest.raises(ValueError, match="permutation"):
            restore_row_order(answer, order)


def test_dispatch_answers_with_the_ranks_concatenated_tensor_itself() -> None:
    request = request_of([[True, False]] * 5 + [[True, True]] * 3, [4] * 8, [3, 1, 2, 3, 1, 2, 3, 1])
    concatenated: list[DataProto] = []

    def dp_call(padded: DataProto) -> DataProto:
        rows = padded.batch["row"].float()
        answers = [
            DataProto.from_dict(tensors={RELEVANCE_KEY: r[:, None, None].expand(-1, 2, 3).clone()})
            for r in rows.chunk(2)
        ]
        concatenated.append(DataProto.concat(answers))
        return concatenated[0]

    answer = dispatch_balanced(request, 2, dp_call)
    assert answer.batch[RELEVANCE_KEY][:, 0, 0].tolist() == list(range(8))  # request order
    assert answer.batch[RELEVANCE_KEY].data_ptr() == concatenated[0].batch[RELEVANCE_KEY].data_ptr()

"""Splitting a replay request over data-parallel ranks so that each rank gets about the same work.

verl's data-parallel dispatch cuts a ``DataProto`` into ``world_size`` equal contiguous chunks. After
exact skipping the rows cost very different amounts (a row with nothing needed costs nothing, one
with every reward needed costs 1 + K passes), and in the colocated placement every rank waits for
the busiest one (their forward passes are collectives). The responses of one prompt (a GRPO group: rows
with the same prompt token ids) share their context prefixes, which the replay computes once per rank
(:mod:`~mrtpo_verl.replay.prefix_tree`), so a group is best kept on one rank. Before dispatch the request is

1. cut into *units*: one per group (rows with identical prompt ids), assigned to ranks costliest first, each to
   the rank with the least cost so far (longest-processing-time greedy). While the busiest rank's cost exceeds
   the mean by more than ``SPLIT_ABOVE`` (few or very unequal groups), the costliest unit of more than one row
   is cut into two halves (rows in request order) and the assignment redone;
2. padded with *idle* rows (no needed pair, no response tokens: no pass, no context, not counted as skipped)
   so that every rank's chunk has as many rows as the fullest rank's, then ordered chunk by chunk;

the answer is put back in the request's order in place (its rows permuted cycle by cycle, one row held aside per
cycle), so the driver holds the answer's (bs, K, L) relevance once, and the padding is dropped as a view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from verl.protocol import DataProto, pad_dataproto_to_divisor

from mrtpo_verl.batch_keys import NEEDED_KEY

__all__ = ["dispatch_balanced", "grouped_rank_rows", "prompt_groups", "restore_row_order", "row_costs"]

#: A unit is cut in two while the busiest rank's estimated cost exceeds the mean rank's by more than this factor.
SPLIT_ABOVE = 1.125


def row_costs(request: DataProto) -> torch.Tensor:
    """(bs,) integer estimated replay cost: tokens per pass × passes, 0 for a row with nothing needed.

    A needed row runs its full context and one pass per needed reward, each over about
    prompt + response tokens (the verifier blocks are not known to the driver and are left out).
    """
    needed = request.batch[NEEDED_KEY].bool()
    prompt_width = request.batch["prompts"].shape[1]
    tokens = request.batch["attention_mask"][:, :prompt_width].sum(dim=1) + request.batch["response_mask"].sum(dim=1)
    passes = torch.where(needed.any(dim=1), 1 + needed.sum(dim=1), torch.zeros_like(tokens))
    return passes * tokens


def prompt_groups(request: DataProto) -> list[list[int]]:
    """Rows with identical prompt token ids (the ``prompts`` where the attention mask is 1), in request order."""
    prompts = request.batch["prompts"]
    prompt_mask = request.batch["attention_mask"][:, : prompts.shape[1]].bool()
    groups: dict[bytes, list[int]] = {}
    for row in range(len(request)):
        groups.setdefault(prompts[row][prompt_mask[row]].numpy().tobytes(), []).append(row)
    return list(groups.values())


def grouped_rank_rows(costs: Sequence[int], groups: Sequence[Sequence[int]], ranks: int) -> list[list[int]]:
    """Rows per rank, groups kept whole where the balance allows (see the module docstring).

    Args:
        costs: per-row integer cost (:func:`row_costs`).
        groups: a partition of ``range(len(costs))`` into groups (:func:`prompt_groups`).
        ranks: number of ranks.

    Returns:
        ``ranks`` lists of row indices (each in increasing order); their lengths may differ.
    """
    rows = sorted(row for group in groups for row in group)
    if ranks < 1 or rows != list(range(len(costs))):
        raise ValueError(f"groups must partition the {len(costs)} rows and ranks must be ≥ 1 (got {ranks})")
    units = [list(group) for group in groups if group]
    mean = sum(costs) / ranks
    while True:
        assignment = _assign_units(units, costs, ranks)
        busiest = max(sum(costs[row] for row in rank_rows) for rank_rows in assignment)
        splittable = [unit for unit in units if len(unit) > 1]
        if busiest <= SPLIT_ABOVE * mean or not splittable:
            return [sorted(rank_rows) for rank_rows in assignment]
        costliest = max(splittable, key=lambda unit: sum(costs[row] for row in unit))
        units.remove(costliest)
        half = len(costliest) // 2
        units += [costliest[:half], costliest[half:]]


def _assign_units(units: list[list[int]], costs: Sequence[int], ranks: int) -> list[list[int]]:
    """Longest-processing-time greedy: costliest unit first, to the rank with the least (cost, rows) so far.

    Units of no cost go last, each to the rank with the fewest rows (fewest padding rows later).
    """
    loads = [(0, 0)] * ranks
    assignment: list[list[int]] = [[] for _ in range(ranks)]
    unit_costs = [sum(costs[row] for row in unit) for unit in units]
    for index in sorted(range(len(units)), key=lambda i: (-unit_costs[i], -len(units[i]), units[i][0])):
        if unit_costs[index]:
            rank = min(range(ranks), key=lambda r: loads[r])
        else:
            rank = min(range(ranks), key=lambda r: (loads[r][1], r))
        loads[rank] = (loads[rank][0] + unit_costs[index], loads[rank][1] + len(units[index]))
        assignment[rank] += units[index]
    return assignment


def restore_row_order(answer: DataProto, order: Sequence[int]) -> None:
    """Put the rows of ``answer`` (row i answers request row ``order[i]``) in request order, in place.

    Every tensor of ``answer.batch`` is permuted along dim 0 by following the permutation's cycles: each row is
    copied once, and one row per tensor is held aside per cycle, so no second copy of a (bs, K, L) tensor exists.
    ``non_tensor_batch`` arrays are reindexed.

    Args:
        answer: the concatenated answers of the ranks, in the dispatched order.
        order: the permutation the request was dispatched in; ``len(order) == len(answer)``.
    """
    if len(order) != len(answer) or sorted(order) != list(range(len(answer))):
        raise ValueError(f"order must be a permutation of the answer's {len(answer)} rows, got {len(order)} indices")
    source = [0] * len(order)  # source[row]: where request row `row` sits in the answer
    for position, row in enumerate(order):
        source[row] = position
    for key, values in answer.non_tensor_batch.items():
        answer.non_tensor_batch[key] = values[source]
    tensors = list(answer.batch.values()) if answer.batch is not None else []
    placed = bytearray(len(order))
    for start in range(len(order)):
        if placed[start] or source[start] == start:
            continue
        held = [tensor[start].clone() for tensor in tensors]
        target = start
        while source[target] != start:
            for tensor in tensors:
                tensor[target] = tensor[source[target]]
            placed[target] = 1
            target = source[target]
        for tensor, row in zip(tensors, held, strict=True):
            tensor[target] = row
        placed[target] = 1


def dispatch_balanced(request: DataProto, ranks: int, call: Callable[[DataProto], DataProto]) -> DataProto:
    """``call`` (a DP-dispatched worker-group method) on the padded, balanced request; answer in request order.

    Rank ``i`` gets chunk ``i``: the rows :func:`grouped_rank_rows` gave it, then idle padding rows up to the
    fullest rank's row count.

    The answer ``call`` returns (verl's concatenation of the ranks' answers) is reordered in place and the
    padding rows are cut off as a view: no copy of the answer is made.
    """
    rows = len(request)
    if not rows or ranks < 1:
        raise ValueError(f"a replay request of {rows} rows cannot be dispatched to {ranks} ranks")
    rank_rows = grouped_rank_rows(row_costs(request).tolist(), prompt_groups(request), ranks)
    chunk = max(1, max(len(part) for part in rank_rows))
    padded, pad = pad_dataproto_to_divisor(request, chunk * ranks)
    if pad:
        padded.batch[NEEDED_KEY][rows:] = False  # idle rows: nothing to replay ...
        padded.batch["response_mask"][rows:] = 0  # ... and no response to count as skipped
    padding = iter(range(rows, rows + pad))
    order = [row for part in rank_rows for row in [*part, *(next(padding) for _ in range(chunk - len(part)))]]
    answer = call(padded[torch.tensor(order, dtype=torch.long)])  # indexing copies: the caller's request is kept
    restore_row_order(answer, order)
    return answer[:rows] if pad else answer

"""Splitting a replay request over data-parallel ranks so that each rank gets about the same work.

verl's data-parallel dispatch cuts a ``DataProto`` into ``world_size`` equal contiguous chunks. After
exact skipping the rows cost very different amounts (a row with nothing needed costs nothing, one
with every reward needed costs 1 + K passes), and in the colocated placement every rank waits for
the busiest one (their forward passes are collectives). So before dispatch the request is

1. padded to a multiple of the rank count with *idle* rows (no needed pair, no response tokens:
   no pass, no context, not counted as skipped), and
2. reordered so that each contiguous chunk holds about the same estimated cost (verl's own
   Karmarkar-Karp balancer, equal-size parts);

the answer is put back in the request's order in place (its rows permuted cycle by cycle, one row held aside per
cycle), so the driver holds the answer's (bs, K, L) relevance once, and the padding is dropped as a view.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from verl.protocol import DataProto, pad_dataproto_to_divisor
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

from mrtpo_verl.batch_keys import NEEDED_KEY

__all__ = ["balanced_row_order", "dispatch_balanced", "restore_row_order", "row_costs"]


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


def balanced_row_order(costs: Sequence[int], chunks: int) -> list[int]:
    """A permutation of the rows whose ``chunks`` equal contiguous pieces have about equal total cost.

    verl's own balancer (``get_seqlen_balanced_partitions``, Karmarkar-Karp with equal-size parts,
    what verl uses to balance sequence lengths over data-parallel ranks) does the partitioning.

    Args:
        costs: per-row integer cost; ``len(costs)`` must be a multiple of ``chunks``.
        chunks: number of equal pieces the dispatch will cut.

    Returns:
        Row indices, chunk 0's rows first.
    """
    if chunks < 1 or not costs or len(costs) % chunks:
        raise ValueError(f"{len(costs)} rows cannot be cut into {chunks} equal non-empty chunks")
    partitions = get_seqlen_balanced_partitions(list(costs), k_partitions=chunks, equal_size=True)
    return [row for partition in partitions for row in partition]


def restore_row_order(answer: DataProto, order: Sequence[int]) -> None:
    """Put the rows of ``answer`` (row i answers request row ``order[i]``) in request order, in place.

    Every tensor of ``answer.batch`` is permuted along dim 0 by following the permutation's cycles: each row is
    copied once, and one row per tensor is held aside per cycle, so no second copy of a (bs, K, L) tensor exists.
    ``non_tensor_batch`` arrays are reindexed.

    Args:
        answer: the concatenated answers of the ranks, in the dispatched order.
        order: the permutation :func:`balanced_row_order` returned; ``len(order) == len(answer)``.
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

    The answer ``call`` returns (verl's concatenation of the ranks' answers) is reordered in place and the
    padding rows are cut off as a view: no copy of the answer is made.
    """
    rows = len(request)
    padded, pad = pad_dataproto_to_divisor(request, ranks)
    if pad:
        padded.batch[NEEDED_KEY][rows:] = False  # idle rows: nothing to replay ...
        padded.batch["response_mask"][rows:] = 0  # ... and no response to count as skipped
    order = balanced_row_order(row_costs(padded).tolist(), ranks)
    answer = call(padded[torch.tensor(order, dtype=torch.long)])  # indexing copies: the caller's request is kept
    restore_row_order(answer, order)
    return answer[:rows] if pad else answer

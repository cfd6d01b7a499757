"""Splitting a replay request over data-parallel ranks so that each rank gets about the same work.

verl's data-parallel dispatch cuts a ``DataProto`` into ``world_size`` equal contiguous chunks. After
exact skipping the rows cost very different amounts (a row with nothing needed costs nothing, one
with every reward needed costs 1 + K passes), and in the colocated placement every rank waits for
the busiest one (their forward passes are collectives). So before dispatch the request is

1. padded to a multiple of the rank count with *idle* rows (no needed pair, no response tokens:
   no pass, no context, not counted as skipped), and
2. reordered so that each contiguous chunk holds about the same estimated cost
   (greedy longest-processing-time: the costliest row goes to the chunk with the least work that
   still has room);

the answer is put back in the request's order and the padding dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from verl.protocol import DataProto, pad_dataproto_to_divisor

__all__ = ["balanced_row_order", "dispatch_balanced", "row_costs"]

NEEDED_KEY = "mrtpo_needed"


def row_costs(request: DataProto) -> torch.Tensor:
    """(bs,) estimated replay cost: tokens per pass × passes, 0 for a row with nothing needed.

    A needed row runs its full context and one pass per needed reward, each over about
    prompt + response tokens (the verifier blocks are not known to the driver and are left out).
    """
    needed = request.batch[NEEDED_KEY].bool()
    prompt_width = request.batch["prompts"].shape[1]
    tokens = request.batch["attention_mask"][:, :prompt_width].sum(dim=1) + request.batch["response_mask"].sum(dim=1)
    passes = torch.where(needed.any(dim=1), 1 + needed.sum(dim=1), torch.zeros_like(tokens))
    return (passes * tokens).float()


def balanced_row_order(costs: Sequence[float], chunks: int) -> list[int]:
    """A permutation of the rows whose ``chunks`` equal contiguous pieces have about equal total cost.

    Args:
        costs: per-row cost; ``len(costs)`` must be a multiple of ``chunks``.
        chunks: number of equal pieces the dispatch will cut.

    Returns:
        Row indices, chunk 0's rows first.
    """
    if chunks < 1 or len(costs) % chunks:
        raise ValueError(f"{len(costs)} rows cannot be cut into {chunks} equal chunks")
    capacity = len(costs) // chunks
    members: list[list[int]] = [[] for _ in range(chunks)]
    load = [0.0] * chunks
    for row in sorted(range(len(costs)), key=lambda index: (-costs[index], index)):
        open_chunks = [chunk for chunk in range(chunks) if len(members[chunk]) < capacity]
        target = min(open_chunks, key=lambda chunk: (load[chunk], chunk))
        members[target].append(row)
        load[target] += costs[row]
    return [row for chunk in members for row in chunk]


def dispatch_balanced(request: DataProto, ranks: int, call: Callable[[DataProto], DataProto]) -> DataProto:
    """``call`` (a DP-dispatched worker-group method) on the padded, balanced request; answer in request order."""
    rows = len(request)
    padded, pad = pad_dataproto_to_divisor(request, ranks)
    if pad:
        padded.batch[NEEDED_KEY][rows:] = False  # idle rows: nothing to replay ...
        padded.batch["response_mask"][rows:] = 0  # ... and no response to count as skipped
    order = torch.tensor(balanced_row_order(row_costs(padded).tolist(), ranks), dtype=torch.long)
    answer = call(padded[order])  # indexing copies: the caller's request is left as it was
    answer = answer[torch.argsort(order)]
    return answer[:rows] if pad else answer

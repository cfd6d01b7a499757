"""The ranks' answers of a data-parallel worker-group call, put together one rank at a time.

verl's collect for a data-parallel ``DataProto`` method (``DataProto.concat``) holds every rank's answer and their
concatenation at once: on the driver, two copies of a replay answer's (bs, K, L) relevance. :func:`concat_releasing`
makes the same ``DataProto`` (tensors concatenated along rows, ``non_tensor_batch`` and ``meta_info`` merged by
``DataProto.concat`` itself, per-rank ``metrics`` as lists) by copying each rank's tensors into one output allocated
up front and dropping that rank's answer before the next: the driver holds one copy plus one rank's answer.

:data:`DP_COMPUTE_PROTO_RELEASING` and :func:`mesh_compute_proto_releasing` are ``@register`` dispatch modes that
split the request as verl's ``Dispatch.DP_COMPUTE_PROTO`` and ``make_nd_compute_dataproto_dispatch_fn`` do and
collect with :func:`concat_releasing`.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from verl.protocol import DataProto

from mrtpo_verl.compat.verl import dp_dispatch_with_collect, mesh_dispatch_with_collect

__all__ = ["DP_COMPUTE_PROTO_RELEASING", "concat_releasing", "mesh_compute_proto_releasing"]


def concat_releasing(answers: list[Any]) -> DataProto:
    """``DataProto.concat(answers)``, emptying ``answers`` as each rank's tensors are copied.

    Each tensor of the result is allocated once, (total rows, ...) with the first answer's trailing shape, dtype and
    device, and filled rank after rank; ``answers[i]`` is set to None once its rows are copied, so the caller's last
    reference to it goes then. Answers whose batch holds anything but plain tensors are concatenated by verl.

    Args:
        answers: the ranks' ``DataProto`` answers in rank order; emptied.

    Raises:
        ValueError: no answers, or answers whose tensor keys, trailing shapes or dtypes differ (named).
        TypeError: an answer that is not a ``DataProto``.
    """
    if not answers:
        raise ValueError("no answers to concatenate")
    for rank, answer in enumerate(answers):
        if not isinstance(answer, DataProto):
            raise TypeError(f"answer {rank} is a {type(answer).__name__}, not a DataProto")
    merged = DataProto.concat(
        [DataProto(batch=None, non_tensor_batch=a.non_tensor_batch, meta_info=a.meta_info) for a in answers]
    )
    batches = [answer.batch for answer in answers]
    if all(batch is None for batch in batches):
        answers.clear()
        return merged
    if any(batch is None for batch in batches) or not all(
        isinstance(value, torch.Tensor) for batch in batches for value in batch.values()
    ):
        del batches
        whole = DataProto.concat(answers)
        answers.clear()
        return whole
    layout = {key: (value.shape[1:], value.dtype, value.device) for key, value in batches[0].items()}
    device = batches[0].device
    sizes = [batch.batch_size[0] for batch in batches]
    del batches
    total = sum(sizes)
    tensors = {key: torch.empty((total, *shape), dtype=dtype, device=at) for key, (shape, dtype, at) in layout.items()}
    start = 0
    for rank, rows in enumerate(sizes):
        batch = answers[rank].batch
        answers[rank] = None
        if set(batch.keys()) != set(layout):
            raise ValueError(f"answer {rank} has tensors {sorted(batch.keys())}, answer 0 has {sorted(layout)}")
        for key, value in batch.items():
            shape, dtype, _ = layout[key]
            if value.shape[1:] != shape or value.dtype != dtype:
                raise ValueError(
                    f"answer {rank}'s {key!r} is {tuple(value.shape)} {value.dtype}; answer 0's rows are "
                    f"{tuple(shape)} {dtype}"
                )
            tensors[key][start : start + rows].copy_(value)
        start += rows
        del batch
    answers.clear()
    merged.batch = TensorDict(tensors, batch_size=[start], device=device)
    merged.check_consistency()
    return merged


#: ``Dispatch.DP_COMPUTE_PROTO``'s split, the answers put together by :func:`concat_releasing`.
DP_COMPUTE_PROTO_RELEASING = dp_dispatch_with_collect(concat_releasing)


def mesh_compute_proto_releasing(mesh_name: str) -> dict[str, Any]:
    """``make_nd_compute_dataproto_dispatch_fn(mesh_name)``'s split, the answers put together by
    :func:`concat_releasing`."""
    return mesh_dispatch_with_collect(mesh_name, concat_releasing)

"""The TransferQueue batch of verl's v1 trainers, as MRTPO's advantage step reads and writes it.

verl 0.9.1's v1 trainers hand each stage a ``KVBatchMeta`` (keys, tags, a partition) whose fields live
in TransferQueue; a stage reads the fields it names and writes its outputs back. What we rely on:
the key format, the padding tag, where the reward function's extra outputs sit, and how non-tensor
fields come back. verl's ``neo`` branch drops TransferQueue for the v0 ``DataProto`` path: this
module is what changes then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta

__all__ = [
    "KVBatchMeta",
    "available_fields",
    "batch_tags",
    "float_column",
    "is_padding_row",
    "object_column",
    "pop_reward_output",
    "prompt_lengths",
    "read_fields",
    "response_lengths",
    "rollout_attention_mask",
    "row_key_parts",
    "stored_response_ids",
    "tagged_response_lengths",
    "write_fields",
]


def row_key_parts(key: str) -> tuple[str, int]:
    """(uid, session id) of a row key ``{uid}_{session_id}_{index}``.

    Relies on: verl 0.9.1's agent loop naming each trajectory's row that way (``agent_loop_tq.py``).

    Raises:
        ValueError: a key of another form.
    """
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        raise ValueError(f"row key {key!r} is not verl's '{{uid}}_{{session_id}}_{{index}}'")
    return parts[0], int(parts[1])


def batch_tags(batch: KVBatchMeta) -> list[dict[str, Any]]:
    """Each row's tag dict, in row order (empty dicts when the batch carries none).

    Relies on: ``KVBatchMeta.tags`` (TransferQueue 0.1, verl 0.9.1).
    """
    return [dict(tag or {}) for tag in batch.tags] if batch.tags else [{} for _ in batch.keys]


def is_padding_row(tag: Mapping[str, Any] | None) -> bool:
    """True for a synthetic row added by verl's ``upsample_batch_to_divisible_size`` (tag ``is_padding``).

    Relies on: that tag name (verl 0.9.1 ``trainer/ppo/v1/utils.py``).
    """
    return bool((tag or {}).get("is_padding", False))


def read_fields(batch: KVBatchMeta, fields: Sequence[str] | None = None, rows: int | None = None) -> TensorDict:
    """The batch's ``fields`` (all of them when None) for its first ``rows`` rows (all when None).

    Relies on: ``transfer_queue.kv_batch_get(keys, partition_id, select_fields)`` (TransferQueue 0.1).
    """
    keys = batch.keys if rows is None else batch.keys[:rows]
    if fields is None:
        return tq.kv_batch_get(keys=keys, partition_id=batch.partition_id)
    return tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=list(fields))


def write_fields(batch: KVBatchMeta, fields: Mapping[str, Any]) -> KVBatchMeta:
    """Write per-row ``fields`` (each with the batch's rows first) back; returns the updated batch meta.

    Relies on: ``transfer_queue.kv_batch_put(keys, partition_id, fields)`` (TransferQueue 0.1).
    """
    return tq.kv_batch_put(
        keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(dict(fields), batch_size=len(batch))
    )


def _items(values: Any) -> list[Any]:
    """Plain Python items of a non-tensor field (NonTensorStack, LinkedList or ndarray).

    Iterating a NonTensorStack yields NonTensorData wrappers; ``tolist`` unwraps them (as verl does for uid).
    """
    items = values.tolist() if hasattr(values, "tolist") else list(values)
    return [getattr(item, "data", item) if type(item).__name__ == "NonTensorData" else item for item in items]


def object_column(values: Any) -> np.ndarray:
    """A non-tensor field → (rows,) object array.

    Relies on: tensordict 0.10's ``NonTensorStack.tolist`` / ``NonTensorData.data``.
    """
    items = _items(values)
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def float_column(values: Any, key: str) -> np.ndarray:
    """A numeric non-tensor field → (rows,) float64 array.

    Relies on: as :func:`object_column`.

    Raises:
        ValueError: naming ``key``, for a value that is not a number.
    """
    items = _items(values)
    try:
        return np.asarray([float(v) for v in items], dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"mrtpo: reward component {key!r} holds non-numeric values ({error})") from error


def _reward_extra_info(row_extra_fields: Any) -> dict[str, Any]:
    return dict((row_extra_fields or {}).get("reward_extra_info") or {})


def available_fields(first_row: TensorDict) -> set[str]:
    """Field names of a one-row read, plus the reward function's extra outputs kept inside ``extra_fields``.

    Relies on: verl 0.9.1's agent loop storing the reward function's extra keys per row in
    ``extra_fields["reward_extra_info"]`` rather than as fields of their own.
    """
    names = set(first_row.keys())
    if "extra_fields" in names:
        names |= set(_reward_extra_info(object_column(first_row["extra_fields"])[0]))
    return names


def pop_reward_output(data: TensorDict, extra_fields: np.ndarray | None, key: str) -> Any:
    """A reward-function output column: a field of its own (removed from ``data``), else each row's
    ``extra_fields["reward_extra_info"][key]``.

    Relies on: as :func:`available_fields`.

    Raises:
        KeyError: naming the key and, for a row that lacks it, the row and the keys it has.
    """
    if key in data.keys():  # noqa: SIM118  (TensorDict)
        return data.pop(key)
    if extra_fields is None:
        raise KeyError(f"mrtpo: no field {key!r} in the batch")
    column = []
    for row, fields in enumerate(extra_fields):
        info = _reward_extra_info(fields)
        if key not in info:
            raise KeyError(f"mrtpo: sample {row} has no reward output {key!r} (reward_extra_info: {sorted(info)})")
        column.append(info[key])
    return column


def prompt_lengths(data: TensorDict) -> torch.Tensor:
    """(rows,) prompt lengths of the nested ``prompts`` field, read before it is padded.

    Relies on: verl 0.9.1 keeping ``prompts`` as a jagged nested tensor (``offsets()``).
    """
    return data["prompts"].offsets().diff()


def response_lengths(data: TensorDict) -> torch.Tensor:
    """(rows,) response lengths of the nested ``responses`` field, read before it is padded.

    A response is every token the agent loop appended after the prompt: the generated turns *and*, in a
    multi-turn (tool agent) trajectory, the tool outputs and chat-template tokens between them
    (``AgentLoopOutput.response_ids``); ``response_mask`` marks only the generated ones.

    Relies on: verl 0.9.1 keeping ``responses`` as a jagged nested tensor, as ``_compute_reward_colocate`` reads it.
    """
    return data["responses"].offsets().diff()


def rollout_attention_mask(
    prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, prompt_width: int, response_width: int
) -> torch.Tensor:
    """(rows, prompt_width + response_width) int64 attention mask over [prompts | responses], both right-padded
    as ``to_padded_tensor`` leaves them: 1 on each row's first ``prompt_lengths`` prompt columns and first
    ``response_lengths`` response columns (tool outputs included), 0 on padding.

    Relies on: verl 0.9.1's v1 trainer building the mask from the stored lengths this way
    (``PPOTrainer._compute_reward_colocate`` with ``PPOTrainer._lengths_to_mask``, ``trainer/ppo/v1/trainer_base.py``);
    the same function is called here.
    """
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    prompt_mask = PPOTrainer._lengths_to_mask(prompt_lengths, prompt_width)
    response_mask = PPOTrainer._lengths_to_mask(response_lengths, response_width)
    return torch.cat([prompt_mask, response_mask], dim=1)


def stored_response_ids(data: TensorDict) -> list[torch.Tensor]:
    """Each row's response token ids as the rollout stored them (no padding): the nested ``responses`` rows.

    Relies on: as :func:`response_lengths`.
    """
    return list(data["responses"].unbind())


def tagged_response_lengths(batch: KVBatchMeta) -> list[int | None]:
    """Each row's response length as verl's agent loop tagged it (``response_len``), None where a row has no tag.

    A record of the length kept apart from the stored tensors (written by ``AgentLoopWorkerTQ._agent_loop_postprocess``
    next to them, and by ``upsample_batch_to_divisible_size`` for its padding rows).

    Relies on: that tag name (verl 0.9.1 ``trainer/ppo/v1/agent_loop_tq.py``, ``trainer/ppo/padding_utils.py``).
    """
    lengths = [tag.get("response_len") for tag in batch_tags(batch)]
    return [None if length is None else int(length) for length in lengths]

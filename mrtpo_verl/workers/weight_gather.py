"""The actor's full weights on rank 0 only (the dedicated replay pool's weight sync), the other ranks holding none.

verl's own export (``engine.get_per_tensor_param``) all-gathers every parameter (``DTensor.full_tensor``), so each
rank holds each full tensor for a moment. For FSDP2's usual layout — every parameter a DTensor sharded on dim 0
over a one-dimensional mesh — this module sends the shards to rank 0 instead (``torch.distributed.gather``):

- rank 0 receives each tensor into one buffer of ``ranks × ceil(rows / ranks)`` rows, casts it to the wanted dtype
  on the CPU and keeps it: it holds the model once, in that dtype, plus one tensor in flight;
- every other rank sends the shard it already holds (padded to the common row count only when it is short) and
  keeps nothing.

Tied parameters (e.g. a tied LM head) are gathered once and kept under every name. Rank 0 can hand each tensor
to Ray's object store as soon as it has it (:func:`store_in_object_store`, a numpy buffer written once, no pickled
copy) and drop it, so that only the object store's copy stays and the answer crossing Ray is a dict of
references.

Other layouts — HSDP's two-dimensional mesh, another shard placement, LoRA adapters (verl merges them into the
base weights), FSDP1, QAT — go through verl's export, and the ranks other than 0 drop each gathered tensor at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["DTYPES", "StoredTensor", "gather_weights_to_rank0", "load_stored", "store_in_object_store"]

#: ``mrtpo.replay.dedicated_dtype`` names → torch dtypes.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor in Ray's object store, as a numpy array (bf16 as its int16 bit pattern: numpy has no bf16)."""

    ref: Any
    dtype: str

    def load(self) -> torch.Tensor:
        import ray

        array = ray.get(self.ref)
        tensor = torch.from_numpy(array.copy() if not array.flags.writeable else array)
        return tensor.view(torch.bfloat16) if self.dtype == "bf16" else tensor


def store_in_object_store(tensor: torch.Tensor) -> StoredTensor:
    """Put a CPU tensor into Ray's object store without an intermediate copy (numpy buffers go out of band)."""
    import ray

    if tensor.dtype == torch.bfloat16:
        return StoredTensor(ray.put(tensor.view(torch.int16).numpy()), "bf16")
    return StoredTensor(ray.put(tensor.numpy()), str(tensor.dtype))


def load_stored(weights: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A state dict whose values may be :class:`StoredTensor` s → plain tensors (one fetch per stored tensor)."""
    loaded: dict[int, torch.Tensor] = {}
    out = {}
    for name, value in weights.items():
        if isinstance(value, StoredTensor):
            if id(value) not in loaded:
                loaded[id(value)] = value.load()
            value = loaded[id(value)]
        out[name] = value
    return out


def gather_weights_to_rank0(
    engine: Any, dtype: torch.dtype, keep: Callable[[torch.Tensor], Any] | None = None
) -> dict[str, Any] | None:
    """HF-named full weights on the CPU in ``dtype`` on rank 0; None on every other rank (which must all call this).

    Args:
        engine: verl's actor engine (``ActorRolloutRefWorker.actor.engine``).
        dtype: the dtype rank 0 keeps each tensor in (the dedicated workers' model dtype).
        keep: what rank 0 keeps of each CPU tensor as soon as it has it (e.g. :func:`store_in_object_store`, so
            that the tensor itself is freed at once); None keeps the tensor.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    pairs = _sharded_to_rank0(engine, rank) if _plain_fsdp2(engine) else _verl_export(engine)
    if rank != 0:
        for _name, _tensor in pairs:  # take part in every collective; each tensor is dropped as the loop moves on
            pass
        return None
    from verl.workers.engine.fsdp.utils import unfuse_moe_params

    model_type = getattr(getattr(engine.model_config, "hf_config", None), "model_type", None)
    kept: dict[str, torch.Tensor] = {}
    for name, tensor in pairs:
        if isinstance(tensor, str):  # a tied parameter already kept under that name
            kept[name] = kept[tensor]
            continue
        for hf_name, full in unfuse_moe_params([(name, tensor)], model_type):
            on_cpu = full.detach().to("cpu", dtype)  # no copy when already a CPU tensor in that dtype
            kept[hf_name] = keep(on_cpu) if keep is not None else on_cpu
            del on_cpu
    return kept


def _plain_fsdp2(engine: Any) -> bool:
    """An FSDP2 module without LoRA or QAT (what :func:`_sharded_to_rank0` handles)."""
    from verl.utils.fsdp_utils import fsdp_version

    module = getattr(engine, "module", None)
    inner = getattr(module, "_fsdp_wrapped_module", module)
    return (
        module is not None
        and fsdp_version(module) == 2
        and not hasattr(inner, "peft_config")
        and not getattr(engine, "_qat_enabled", False)
    )


def _verl_export(engine: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """verl's own full-weight stream; LoRA adapters merged into the base weights, as verl sends them to rollout."""
    module = getattr(engine, "module", None)
    inner = getattr(module, "_fsdp_wrapped_module", module)
    if hasattr(inner, "peft_config") and hasattr(engine, "_merged_lora_per_tensor_param"):
        return engine._merged_lora_per_tensor_param()  # type: ignore[no-any-return]
    pairs, _ = engine.get_per_tensor_param()
    return pairs  # type: ignore[no-any-return]


def _sharded_to_rank0(engine: Any, rank: int) -> Iterator[tuple[str, torch.Tensor | str]]:
    """(name, full tensor) on rank 0, or (name, first name) for a tied parameter seen before; on the other ranks
    (name, what they sent)."""
    from torch.distributed.tensor import DTensor
    from verl.utils.model import convert_weight_keys

    module = engine.module
    state = convert_weight_keys(module.state_dict(), getattr(module, "_fsdp_wrapped_module", module))
    first_name: dict[int, str] = {}  # the state dict holds its parameters for the whole loop: ids stay unique
    for name, param in state.items():
        if id(param) in first_name:
            yield name, first_name[id(param)]
            continue
        first_name[id(param)] = name
        if not isinstance(param, DTensor):
            full = param.detach()
        elif _sharded_rows_on_one_mesh(param):
            full = _gather_rows(param, rank)
        else:
            full = param.full_tensor()  # other DTensor layouts: verl's way, every rank holds it for a moment
        yield name, full


def _sharded_rows_on_one_mesh(param: Any) -> bool:
    from torch.distributed.tensor import Shard

    mesh = param.device_mesh
    placements = param.placements
    return (
        mesh.ndim == 1
        and len(placements) == 1
        and isinstance(placements[0], Shard)
        and placements[0].dim == 0
        and dist.get_global_rank(mesh.get_group(), 0) == 0
    )


def _gather_rows(param: Any, rank: int) -> torch.Tensor:
    """The full tensor on rank 0 (a view of one receive buffer); this rank's sent shard elsewhere.

    FSDP2 cuts dim 0 into ``ranks`` pieces of ``ceil(rows / ranks)`` rows (the last ones shorter or empty); each
    rank sends its piece padded to that length, and rank 0 receives the pieces straight into their place.
    """
    group = param.device_mesh.get_group()
    ranks = dist.get_world_size(group)
    rows, rest = param.shape[0], tuple(param.shape[1:])
    piece = -(-rows // ranks)
    local = param.to_local()
    send = local.contiguous()
    if local.shape[0] != piece:
        send = torch.zeros((piece, *rest), dtype=local.dtype, device=local.device)
        send[: local.shape[0]] = local
    if rank != 0:
        dist.gather(send, None, dst=0, group=group)
        return send
    buffer = torch.empty((ranks * piece, *rest), dtype=local.dtype, device=local.device)
    dist.gather(send, list(buffer.chunk(ranks)), dst=0, group=group)
    return buffer[:rows]

"""The actor's full weights on rank 0 only (the dedicated replay pool's weight sync), the other ranks holding none.

verl's own export (``engine.get_per_tensor_param``) all-gathers every parameter (``DTensor.full_tensor``), so each
rank holds each full tensor for a moment. For FSDP2's usual layout — every parameter a DTensor sharded on dim 0
over a one-dimensional mesh, rank r holding rows ``[r·p, (r+1)·p)`` with ``p = ceil(rows / ranks)`` — this module
moves the row blocks to rank 0 instead, one block at a time (``torch.distributed.send`` / ``recv``):

- rank 0 takes its own block, then receives each other rank's block in turn, casts it to the wanted dtype on the
  CPU and hands it to ``keep`` (e.g. :func:`store_in_object_store`, which copies it once into Ray's object store
  and lets it go): besides what ``keep`` holds, rank 0 has one block in flight, ``1 / ranks`` of a tensor;
- every other rank sends the block it already holds and allocates nothing.

A tensor is then a list of row blocks (:class:`StoredTensor`), joined where it is loaded. Tied parameters (e.g. a
tied LM head) are moved once and kept under every name.

Other layouts — HSDP's two-dimensional mesh, another shard placement, LoRA adapters (verl merges them into the
base weights), FSDP1, QAT — go through verl's export, and the ranks other than 0 drop each gathered tensor at once.
Packed MoE expert tensors stay packed under their module's name, as the replay worker's transformers model holds
them. verl's export (the other layouts) splits them per expert for vLLM, so a MoE model on one of those layouts
cannot feed the dedicated pool: its first weight load names the unexpected keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mrtpo_verl.compat.torch_fsdp import is_fsdp2, wrapped_module
from mrtpo_verl.compat.verl import engine_full_weights, engine_module, hf_state_dict, is_lora_or_qat

__all__ = ["DTYPES", "StoredTensor", "gather_weights_to_rank0", "load_stored", "store_in_object_store"]

#: ``mrtpo.replay.dedicated_dtype`` names → torch dtypes.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StoredTensor:
    """One tensor in Ray's object store as row blocks, each a numpy array (bf16 as its int16 bits: numpy has none)."""

    refs: tuple[Any, ...]
    dtype: str

    def load(self) -> torch.Tensor:
        import ray

        blocks = [torch.from_numpy(array.copy()) for array in ray.get(list(self.refs))]  # store buffers: read-only
        tensor = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        return tensor.view(torch.bfloat16) if self.dtype == "bf16" else tensor


def store_in_object_store(blocks: Iterable[torch.Tensor]) -> StoredTensor:
    """Put a tensor's CPU row blocks into Ray's object store, each copied once as it comes (numpy buffers go out of
    band) and let go before the next is taken."""
    import ray

    refs, dtype = [], ""
    for block in blocks:
        bf16 = block.dtype == torch.bfloat16
        dtype = "bf16" if bf16 else str(block.dtype)
        refs.append(ray.put((block.view(torch.int16) if bf16 else block).numpy()))
        del block
    return StoredTensor(tuple(refs), dtype)


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
    engine: Any, dtype: torch.dtype, keep: Callable[[Iterable[torch.Tensor]], Any] | None = None
) -> dict[str, Any] | None:
    """HF-named full weights on the CPU in ``dtype`` on rank 0; None on every other rank (which must all call this).

    Args:
        engine: verl's actor engine (``ActorRolloutRefWorker.actor.engine``).
        dtype: the dtype rank 0 keeps each tensor in (the dedicated workers' model dtype).
        keep: what rank 0 keeps of a tensor, given its CPU row blocks one by one as they arrive (e.g.
            :func:`store_in_object_store`, so that each block is let go at once); None keeps the joined tensor.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if _plain_fsdp2(engine):
        pairs: Iterable[tuple[str, Any]] = _row_blocks_to_rank0(engine, rank)
    else:
        pairs = ((name, iter([tensor])) for name, tensor in _verl_export(engine))
    if rank != 0:
        for _name, blocks in pairs:  # take part in every transfer; nothing is kept
            for _block in blocks:
                pass
        return None
    # Every tensor keeps its module's name, packed MoE experts included: the replay worker loads the same
    # transformers model class, not a vLLM checkpoint layout.
    kept: dict[str, Any] = {}
    for name, blocks in pairs:
        if isinstance(blocks, str):  # a tied parameter already kept under that name
            kept[name] = kept[blocks]
        else:
            on_cpu = (block.detach().to("cpu", dtype) for block in blocks)  # no copy when already so
            kept[name] = keep(on_cpu) if keep is not None else torch.cat(list(on_cpu))
    return kept


def _plain_fsdp2(engine: Any) -> bool:
    """An FSDP2 module without LoRA or QAT (what :func:`_row_blocks_to_rank0` handles)."""
    module = engine_module(engine)
    return module is not None and is_fsdp2(module) and not is_lora_or_qat(engine, wrapped_module(module))


def _verl_export(engine: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """verl's own full-weight stream; LoRA adapters merged into the base weights, as verl sends them to rollout."""
    module = engine_module(engine)
    return engine_full_weights(engine, wrapped_module(module) if module is not None else None)


def _row_blocks_to_rank0(engine: Any, rank: int) -> Iterator[tuple[str, Iterator[torch.Tensor] | str]]:
    """Per parameter: (name, its row blocks on rank 0 / the blocks this rank sends), or (name, first name) for a
    tied parameter seen before. Each block iterator must be consumed before the next parameter's."""
    from torch.distributed.tensor import DTensor

    module = engine_module(engine)
    state = hf_state_dict(module, wrapped_module(module))
    first_name: dict[int, str] = {}  # the state dict holds its parameters for the whole loop: ids stay unique
    for name, param in state.items():
        if id(param) in first_name:
            yield name, first_name[id(param)]
            continue
        first_name[id(param)] = name
        if not isinstance(param, DTensor):
            yield name, iter([param.detach()])
        elif _sharded_rows_on_one_mesh(param):
            yield name, _move_row_blocks(param, rank)
        else:
            yield name, iter([param.full_tensor()])  # other layouts: verl's way, every rank holds it for a moment


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


def _move_row_blocks(param: Any, rank: int) -> Iterator[torch.Tensor]:
    """Rank 0: its own block, then each other rank's, received in turn. Other ranks: send their block (if any)."""
    group = param.device_mesh.get_group()
    ranks = dist.get_world_size(group)
    rows, rest = param.shape[0], tuple(param.shape[1:])
    piece = -(-rows // ranks)
    local = param.to_local()
    if rank != 0:
        if local.shape[0]:
            dist.send(local.contiguous(), dst=0, group=group)
        yield local
        return
    yield local
    for source in range(1, ranks):
        count = min(piece, max(0, rows - source * piece))  # FSDP2's cut: the last ranks may hold fewer rows or none
        if count:
            block = torch.empty((count, *rest), dtype=local.dtype, device=local.device)
            dist.recv(block, src=dist.get_global_rank(group, source), group=group)
            yield block
            del block

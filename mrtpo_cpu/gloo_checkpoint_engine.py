"""A ``gloo`` checkpoint engine: actor rank 0 broadcasts its weights to the rollout workers over TCP.

verl 0.9.1's ``separate_async`` trainer pushes the actor's weights to its standalone rollout pool
through a checkpoint engine (``verl/checkpoint_engine/base.py``: ``CheckpointEngineManager``) and
refuses the in-process ``naive`` one; its own engines (nccl, nixl, mooncake, hccl) need
accelerators. This one moves the same bytes over a torch ``ProcessGroupGloo`` (CPU tensors, TCP),
registered as ``checkpoint_engine.backend=gloo`` with ``CheckpointEngineRegistry.register``.

The contract verl's manager drives, once per weight sync:

1. ``prepare()`` on every actor rank and rollout worker: the master (actor rank 0, the one verl
   builds with ``is_master=True``) opens a ``TCPStore`` server on a free port and reports its
   address; everyone else reports nothing.
2. ``build_topology(actor_world_size, rollout_world_size, metadata)`` (on the driver): actor rank 0
   is group rank 0; the other actor ranks stay out (rank -1: they only walk their weight
   generator, which is collective across the actor's FSDP group); rollout worker ``i`` is rank
   ``1 + i``.
3. ``init_process_group(rank, world_size, master_addr, master_port)``: every member joins a gloo
   group of its own (not the process's default group, which the actor's FSDP already uses).
4. ``send_weights`` / ``receive_weights``: the weights travel in buckets of at most ``bucket_size``
   bytes; each bucket is three broadcasts from rank 0: a header ``[meta_bytes, payload_bytes,
   is_last]`` (int64), the pickled chunk list (uint8) and the payload (uint8). Tensors larger than
   a bucket are cut into chunks and joined again with verl's ``split_weight_chunks`` /
   ``merge_weight_chunks``.
5. ``finalize()``: the group and the store are dropped (a fresh group every sync: CPU runs are small
   and a rollout replica may have been added or removed in between).
"""

from __future__ import annotations

import asyncio
import pickle
import socket
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = ["BACKEND_NAME", "GlooCheckpointEngine"]

#: ``actor_rollout_ref.rollout.checkpoint_engine.backend`` of this engine.
BACKEND_NAME = "gloo"

_SOURCE = 0  # group rank of actor rank 0, the only sender
_ALIGN = 16  # bytes; a view as float64/int64 needs its storage offset to be a multiple of 8


def _local_ip() -> str:
    """An address of this host that the other Ray processes can reach (Ray's own choice of it)."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address()).strip("[]")
    except Exception:  # outside Ray (or before it is up): the host name's address
        pass
    return socket.gethostbyname(socket.gethostname())


@CheckpointEngineRegistry.register(BACKEND_NAME)
class GlooCheckpointEngine(CheckpointEngine):
    """Weights from actor rank 0 to every rollout worker over a gloo broadcast group.

    Args:
        bucket_size: bytes per broadcast bucket (verl passes ``update_weights_bucket_megabytes << 20``).
        is_master: True on actor rank 0 (verl's actor worker sets it; rollout workers never do).
        timeout_s: how long a member waits for the others (joining the group, each broadcast).
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size <= 0:
            raise ValueError(f"gloo checkpoint engine: bucket_size must be > 0 bytes, got {bucket_size}")
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = timedelta(seconds=timeout_s)
        self.rank: int | None = None
        self.world_size: int | None = None
        self._store: dist.TCPStore | None = None
        self._group: dist.ProcessGroupGloo | None = None
        #: Buckets sent or received in the last sync (tests and logs read it).
        self.buckets_moved = 0

    # -- set-up ---------------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """Master: start the rendezvous store on a free port; returns its address (others: empty)."""
        if not self.is_master:
            return {"is_master": False}
        host = _local_ip()
        # port=0: the OS picks a free port, so two syncs (or two runs) never race for one.
        self._store = dist.TCPStore(host, 0, is_master=True, timeout=self.timeout, wait_for_workers=False)
        return {"is_master": True, "master_addr": host, "master_port": int(self._store.port)}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Group ranks: actor rank 0 → 0, other actor ranks → -1 (outside), rollout worker i → 1 + i."""
        if len(metadata) != actor_wg_world_size + rollout_world_size:
            raise ValueError(
                f"gloo checkpoint engine: {len(metadata)} prepare() results for {actor_wg_world_size} actor ranks "
                f"+ {rollout_world_size} rollout workers"
            )
        master = metadata[0]
        if not master.get("is_master"):
            raise ValueError("gloo checkpoint engine: actor rank 0 must be the master (built with is_master=True)")
        if any(item.get("is_master") for item in metadata[1:]):
            raise ValueError("gloo checkpoint engine: more than one master among the actor ranks and rollout workers")
        world_size = 1 + rollout_world_size
        address = {"master_addr": master["master_addr"], "master_port": master["master_port"]}
        actor = {
            "rank": [_SOURCE] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            **{key: [value] * actor_wg_world_size for key, value in address.items()},
        }
        rollout = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            **{key: [value] * rollout_world_size for key, value in address.items()},
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        """Join the broadcast group (blocks until all ``world_size`` members have joined)."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if rank != _SOURCE:
            self._store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=self.timeout)
        assert self._store is not None, "gloo checkpoint engine: init_process_group on the master before prepare()"
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        """Drop the group and the store (the next sync builds new ones)."""
        self._group = None
        self._store = None
        self.rank = None
        self.world_size = None

    # -- transfer -------------------------------------------------------------------------
    def _broadcast(self, tensor: torch.Tensor) -> None:
        assert self._group is not None, "gloo checkpoint engine: send/receive before init_process_group"
        self._group.broadcast(tensor, _SOURCE).wait()

    async def _broadcast_bucket(self, chunks: list[TensorMeta], payload: torch.Tensor, is_last: bool) -> None:
        meta = torch.frombuffer(bytearray(pickle.dumps(chunks)), dtype=torch.uint8)
        header = torch.tensor([meta.numel(), payload.numel(), int(is_last)], dtype=torch.int64)
        for tensor in (header, meta, payload):
            await asyncio.to_thread(self._broadcast, tensor)
        self.buckets_moved += 1

    @torch.no_grad()
    async def send_weights(self, weights: Any, global_steps: int | None = None) -> dict[str, float]:
        """Broadcast ``(name, tensor)`` pairs from actor rank 0; other actor ranks only drain the generator."""
        if self.rank is None or self.rank > _SOURCE:
            raise RuntimeError(
                f"gloo checkpoint engine: send_weights on group rank {self.rank} (only actor ranks send)"
            )
        if self.rank < 0:
            async for _name, tensor in ensure_async_iterator(weights):
                if hasattr(tensor, "full_tensor"):  # a DTensor's gather is collective over the actor's ranks
                    tensor.full_tensor()
            return {}
        self.buckets_moved = 0
        bucket = torch.empty(self.bucket_size, dtype=torch.uint8)
        chunks: list[TensorMeta] = []
        offset = 0
        async for meta, chunk in split_weight_chunks(_full_cpu_tensors(weights), self.bucket_size):
            # Each chunk starts on an aligned byte so the receiver can view it as its dtype in place.
            offset = -(-offset // _ALIGN) * _ALIGN
            if offset + meta.chunk_size > self.bucket_size:
                await self._broadcast_bucket(chunks, bucket[:offset].clone(), is_last=False)
                chunks, offset = [], 0
            meta.offset = offset
            bucket[offset : offset + meta.chunk_size] = chunk
            chunks.append(meta)
            offset += meta.chunk_size
        await self._broadcast_bucket(chunks, bucket[:offset].clone(), is_last=True)
        return {"gloo_checkpoint_engine/buckets": float(self.buckets_moved)}

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        """Yield the ``(name, tensor)`` pairs rank 0 broadcasts (fresh CPU tensors, safe to keep)."""
        if self.rank is None or self.rank <= _SOURCE:
            raise RuntimeError(f"gloo checkpoint engine: receive_weights on group rank {self.rank} (rollout ranks ≥ 1)")
        self.buckets_moved = 0
        async for name, tensor in merge_weight_chunks(self._received_chunks(), self.bucket_size):
            yield name, tensor.clone()

    async def _received_chunks(self) -> AsyncIterator[tuple[TensorMeta, torch.Tensor]]:
        while True:
            header = torch.empty(3, dtype=torch.int64)
            await asyncio.to_thread(self._broadcast, header)
            meta_bytes, payload_bytes, is_last = (int(value) for value in header)
            meta = torch.empty(meta_bytes, dtype=torch.uint8)
            payload = torch.empty(payload_bytes, dtype=torch.uint8)
            await asyncio.to_thread(self._broadcast, meta)
            await asyncio.to_thread(self._broadcast, payload)
            self.buckets_moved += 1
            for chunk in pickle.loads(meta.numpy().tobytes()):
                yield chunk, payload[chunk.offset : chunk.offset + chunk.chunk_size]
            if is_last:
                return


async def _full_cpu_tensors(weights: Any) -> AsyncIterator[tuple[str, torch.Tensor]]:
    """The actor's ``(name, tensor)`` pairs as whole, contiguous CPU tensors (DTensors gathered)."""
    async for name, tensor in ensure_async_iterator(weights):
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, full.detach().to("cpu").contiguous()

"""The ``gloo`` checkpoint engine moves real tensors between processes, through verl's registry.

Two OS processes (``torch.multiprocessing`` spawn) play actor rank 0 and one rollout worker and go
through verl's contract in the order ``CheckpointEngineManager`` drives it: ``prepare`` on both,
``build_topology`` on the parent (as verl's driver does), ``init_process_group``, ``send_weights`` /
``receive_weights``, ``finalize`` — twice, so a second sync builds a fresh group. A small bucket
forces several buckets and a tensor cut into chunks; mixed dtypes and odd sizes check alignment.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
from typing import Any

import pytest
import torch

BUCKET = 256  # bytes: the 40x7 float32 tensor (1120 bytes) spans five buckets


def weights_for(version: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(version)
    return {
        "model.embed.weight": torch.randn(40, 7, generator=generator),
        "model.norm.weight": torch.randn(3, generator=generator).to(torch.bfloat16),
        "model.counts": torch.arange(5, dtype=torch.int64) + version,
        "model.layers.0.bias": torch.randn(1, generator=generator, dtype=torch.float64),
        "lm_head.weight": torch.randn(2, 3, 5, generator=generator),
    }


def _member(role: str, inbox: Any, outbox: Any) -> None:
    import asyncio

    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    import mrtpo_cpu.gloo_checkpoint_engine  # noqa: F401  (registers "gloo")

    engine = CheckpointEngineRegistry.new("gloo", bucket_size=BUCKET, is_master=role == "actor", timeout_s=60)
    try:
        for version in (1, 2):
            outbox.put(engine.prepare())
            engine.init_process_group(**inbox.get(timeout=60))
            if role == "actor":
                stats = asyncio.run(engine.send_weights(iter(weights_for(version).items()), global_steps=version))
                outbox.put(("sent", stats))
            else:

                async def collect(step: int) -> dict[str, torch.Tensor]:
                    return {name: tensor async for name, tensor in engine.receive_weights(global_steps=step)}

                received = asyncio.run(collect(version))
                outbox.put(("received", received, engine.buckets_moved))
            engine.finalize()
    except BaseException as error:  # report to the parent instead of hanging it
        outbox.put(("error", repr(error)))
        raise


def test_gloo_engine_broadcasts_weights_between_two_processes() -> None:
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from mrtpo_cpu.gloo_checkpoint_engine import GlooCheckpointEngine

    assert CheckpointEngineRegistry.get("gloo") is GlooCheckpointEngine
    context = mp.get_context("spawn")
    actor_in, actor_out, rollout_in, rollout_out = (context.Queue() for _ in range(4))
    processes = [
        context.Process(target=_member, args=("actor", actor_in, actor_out)),
        context.Process(target=_member, args=("rollout", rollout_in, rollout_out)),
    ]
    for process in processes:
        process.start()
    try:
        for version in (1, 2):
            metadata = [actor_out.get(timeout=120), rollout_out.get(timeout=120)]
            actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(1, 1, metadata)
            assert actor_kwargs["rank"] == [0] and rollout_kwargs["rank"] == [1]
            actor_in.put({key: values[0] for key, values in actor_kwargs.items()})
            rollout_in.put({key: values[0] for key, values in rollout_kwargs.items()})
            sent, received = actor_out.get(timeout=120), rollout_out.get(timeout=120)
            assert sent[0] == "sent" and received[0] == "received", (sent, received)
            expected = weights_for(version)
            assert list(received[1]) == list(expected)  # every tensor, in the actor's order
            for name, tensor in expected.items():
                assert received[1][name].dtype == tensor.dtype and torch.equal(received[1][name], tensor), name
            assert received[2] == sent[1]["gloo_checkpoint_engine/buckets"] >= 5
    except queue.Empty:
        pytest.fail("a member of the gloo group did not answer within 120 s")
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert [process.exitcode for process in processes] == [0, 0]


def test_topology_keeps_other_actor_ranks_out_and_numbers_rollout_workers() -> None:
    from mrtpo_cpu.gloo_checkpoint_engine import GlooCheckpointEngine

    master = {"is_master": True, "master_addr": "127.0.0.1", "master_port": 1234}
    actor, rollout = GlooCheckpointEngine.build_topology(3, 2, [master] + [{"is_master": False}] * 4)
    assert actor["rank"] == [0, -1, -1] and rollout["rank"] == [1, 2]
    assert set(actor["world_size"] + rollout["world_size"]) == {3}
    assert rollout["master_port"] == [1234, 1234]
    with pytest.raises(ValueError, match="actor rank 0 must be the master"):
        GlooCheckpointEngine.build_topology(1, 1, [{"is_master": False}, {"is_master": False}])
    with pytest.raises(ValueError, match="3 prepare\\(\\) results for 1 actor ranks"):
        GlooCheckpointEngine.build_topology(1, 1, [master, {"is_master": False}, {"is_master": False}])
    with pytest.raises(ValueError, match="bucket_size must be > 0"):
        GlooCheckpointEngine(bucket_size=0)

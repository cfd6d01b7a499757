"""Peak host memory (RSS) per actor rank while the dedicated replay pool's weights are fetched, against the model size.

Two ranks of verl's real actor worker (FSDP2 on gloo, the CPU run) hold the full SmolLM2-135M-Instruct; the driver
asks them for the weights the dedicated replay pool receives before each step (``mrtpo_state_dict``), as
``DedicatedBackend.before_step`` does, and fetches them from the object store. In every rank a thread samples the
process's RSS (``psutil``, every 2 ms) from just before the call until the driver has the weights; the table shows
each rank's peak minus its RSS before the call, as a multiple of the model's size in the dtype sent (fp32 here,
the CPU run's dtype). Targets: rank 0 at most 1.2x (it must hold the weights once), every other rank at most 0.1x.

For comparison the same is measured afterwards for a baseline export (every rank copies every full tensor to the
CPU and only rank 0's copy is kept), reproduced here in a benchmark-only worker method; measured second, it may
reuse memory the allocator kept from the first fetch, so its figures are if anything too low.

    python -m benchmarks.weight_sync_memory          # ~2-3 min on 2 CPU cores; exits 1 if a target is missed
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import ray
from ray import cloudpickle
from verl.single_controller.base.decorator import Dispatch, register

from benchmarks.machine import machine_description
from mrtpo_cpu.distributed import SETUP_HOOK
from mrtpo_cpu.launch import CPU_ENV, compose_actor_config, save_derived_model
from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker
from mrtpo_verl.workers.weight_gather import load_stored

RANKS = 2
RANK0_LIMIT = 1.2
OTHER_LIMIT = 0.1


class MeasuredActorWorker(MRTPOActorRolloutRefWorker):
    """Benchmark-only: the actor worker with an RSS sampler, and the every-rank baseline export to compare with."""

    _sampler: Any = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_rss_sampling(self) -> None:
        process = psutil.Process()
        state = {"baseline": process.memory_info().rss, "peak": 0, "running": True}

        def sample() -> None:
            while state["running"]:
                state["peak"] = max(state["peak"], process.memory_info().rss)
                time.sleep(0.002)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        self._sampler = (state, thread)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_rss_sampling(self) -> tuple[int, int]:
        """(RSS before the call, peak RSS since) in bytes."""
        state, thread = self._sampler
        state["running"] = False
        thread.join()
        return state["baseline"], max(state["peak"], psutil.Process().memory_info().rss)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def every_rank_copy_state_dict(self) -> dict[str, Any] | None:
        """The baseline export: verl's all-gathered tensors copied to the CPU on every rank, rank 0's returned."""
        per_tensor, _ = self.actor.engine.get_per_tensor_param()
        weights = {name: tensor.detach().to("cpu", copy=True) for name, tensor in per_tensor}
        return weights if self.rank == 0 else None


def measure(group: Any, method: str) -> tuple[list[tuple[int, int]], int]:
    """Per rank (baseline, peak) RSS around one weight fetch by ``method``, and the fetched weights' bytes."""
    group.start_rss_sampling()
    answers = getattr(group, method)(*(("fp32",) if method == "mrtpo_state_dict" else ()))
    weights = load_stored(next(answer for answer in answers if answer is not None))
    unique = {id(tensor): tensor for tensor in weights.values()}
    model_bytes = sum(tensor.numel() * tensor.element_size() for tensor in unique.values())
    del answers, weights, unique
    return group.stop_rss_sampling(), model_bytes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers do not import this module
    ray.init(
        address="local",  # a cluster of its own, even if another one runs on this machine
        num_cpus=4,
        num_gpus=RANKS,  # logical: verl's resource pools place one worker per "GPU"; every tensor is on the CPU
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": dict(CPU_ENV), "worker_process_setup_hook": SETUP_HOOK},
    )
    failures = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = save_derived_model(Path(tmp) / "model", num_layers=None)  # the whole SmolLM2-135M
            pool = RayResourcePool(process_on_nodes=[RANKS], use_gpu=True, max_colocate_count=1, name_prefix="rss")
            worker = RayClassWithInitArgs(
                cls=ray.remote(MeasuredActorWorker), config=compose_actor_config(model_dir, RANKS), role="actor"
            )
            group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
            group.init_model()
            # Ours first, on fresh processes: memory the allocator kept from an earlier fetch would hide a later one's.
            results = {method: measure(group, method) for method in ("mrtpo_state_dict", "every_rank_copy_state_dict")}
    finally:
        ray.shutdown()

    for line in machine_description("benchmarks.weight_sync_memory", argv, "SmolLM2-135M-Instruct, fp32, 2 ranks; "):
        print(line)
    print()
    print("| export | rank | RSS before | peak RSS | peak - before | x model size | target |")
    print("|---|---|---|---|---|---|---|")
    for method, (per_rank, model_bytes) in results.items():
        name = "gather to rank 0 (mrtpo_state_dict)" if method == "mrtpo_state_dict" else "baseline: every rank copies"
        for rank, (baseline, peak) in enumerate(per_rank):
            ratio = (peak - baseline) / model_bytes
            limit = RANK0_LIMIT if rank == 0 else OTHER_LIMIT
            verdict = "-"
            if method == "mrtpo_state_dict":
                verdict = f"≤ {limit}x: {'ok' if ratio <= limit else 'MISSED'}"
                if ratio > limit:
                    failures.append(f"rank {rank}: {ratio:.2f}x > {limit}x")
            print(
                f"| {name} | {rank} | {baseline / 2**20:,.0f} MiB | {peak / 2**20:,.0f} MiB | "
                f"{(peak - baseline) / 2**20:,.0f} MiB | {ratio:.2f}x | {verdict} |"
            )
    print(f"\nmodel size (weights sent, fp32, tied weights once): {model_bytes / 2**20:,.0f} MiB")
    for failure in failures:
        print(f"MISSED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Placements that cannot run say so at once, with the numbers, instead of hanging."""

from __future__ import annotations

import pytest
import ray
from omegaconf import OmegaConf

from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError, ReplayConfig
from mrtpo_verl.workers.placement import build_backend, create_replay_worker_group

CFG = MRTPOConfig(reward_keys=("a",), verifier_info_keys=("a_info",))


@pytest.fixture
def one_cpu_ray():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def test_too_many_cpu_workers_is_an_error_with_numbers(one_cpu_ray) -> None:
    with pytest.raises(RuntimeError, match=r"cannot be placed \(CPU: needs 4, free 1\)"):
        create_replay_worker_group(CFG, None, [2, 2], "cpu", cpus_per_worker=1)


def test_gpu_pool_without_gpus_is_an_error(one_cpu_ray) -> None:
    with pytest.raises(RuntimeError, match=r"GPU: needs 1, free 0"):
        create_replay_worker_group(CFG, None, [1], "cuda")


def test_colocated_placement_needs_our_actor_worker_group() -> None:
    class VerlActorGroup:  # verl's own worker group has no compute_mrtpo_relevance
        world_size = 1

    class Trainer:
        config = OmegaConf.create({"trainer": {"nnodes": 1, "device": "cpu"}})
        actor_rollout_wg = VerlActorGroup()

    cfg = MRTPOConfig(reward_keys=("a",), verifier_info_keys=("a_info",), replay=ReplayConfig(placement="colocated"))
    with pytest.raises(TypeError, match=r"MRTPOActorRolloutRefWorker.*has no compute_mrtpo_relevance"):
        build_backend(Trainer(), cfg)


@pytest.mark.parametrize(
    ("workers", "nnodes", "expected"),
    [(1, 2, [1]), (1, 1, [1]), (3, 2, [2, 1]), (4, 2, [2, 2]), (8, 1, [8]), (2, 4, [1, 1])],
)
def test_the_dedicated_pool_starts_exactly_the_configured_number_of_workers(workers, nnodes, expected) -> None:
    from mrtpo_verl.workers.placement import workers_per_node

    assert workers_per_node(workers, nnodes) == expected
    assert sum(workers_per_node(workers, nnodes)) == workers


def test_dedicated_workers_load_in_float32_or_the_actors_compute_dtype_unless_told() -> None:
    from mrtpo_verl.workers.placement import actor_compute_dtype

    def config(mixed_precision):
        fsdp = {"mixed_precision": mixed_precision} if mixed_precision is not None else {}
        return OmegaConf.create({"actor_rollout_ref": {"actor": {"fsdp_config": fsdp}}})

    assert actor_compute_dtype(config(None)) == "bf16"  # verl's FSDP default without a mixed_precision block
    assert actor_compute_dtype(config({"param_dtype": "fp32"})) == "fp32"
    assert actor_compute_dtype(config({"param_dtype": "float16"})) == "fp16"
    # auto: the weights the compute reads: float32 for fp32/tf32 (compute auto on a CPU), fp16 for fp16 (compute auto
    # on CUDA), the actor's compute dtype for compute_dtype=model. The worker decides, from the compute dtype it
    # resolved on its own device (here: compute auto resolved as on a device with or without the fp16 kernel).
    from mrtpo_verl.config import resolve_compute_dtype
    from mrtpo_verl.workers.placement import dedicated_weights_dtype

    def weights(device: str = "cpu", fp16_kernel: bool = True, **replay: str) -> str:
        cfg = ReplayConfig(**replay)
        compute = resolve_compute_dtype(cfg.compute_dtype, device)
        if compute == "fp16" and cfg.compute_dtype == "auto" and not fp16_kernel:
            compute = "tf32"
        return dedicated_weights_dtype(cfg.dedicated_dtype, compute, actor_compute_dtype(config(None)))

    assert weights() == "fp32"
    assert weights("cuda") == "fp16"
    assert weights("cuda", fp16_kernel=False) == "fp32"  # auto fell back to tf32 on the worker: float32 weights
    assert weights(compute_dtype="tf32") == weights("cuda", compute_dtype="fp32") == "fp32"
    assert weights(compute_dtype="model") == weights("cuda", compute_dtype="model") == "bf16"
    assert weights(compute_dtype="model", dedicated_dtype="fp16") == "fp16"
    assert weights(dedicated_dtype="bf16") == weights("cuda", dedicated_dtype="bf16") == "bf16"
    assert weights(compute_dtype="fp16") == "fp16"
    assert weights(compute_dtype="fp16", dedicated_dtype="fp32") == "fp32"
    with pytest.raises(MRTPOConfigError, match=r"replay.dedicated_dtype: got 'int8' .*auto \| fp32 \| bf16 \| fp16"):
        ReplayConfig(dedicated_dtype="int8").validate()

"""Placements that cannot run say so at once, with the numbers, instead of hanging."""

from __future__ import annotations

import pytest
import ray
from omegaconf import OmegaConf

from mrtpo_verl.config import MRTPOConfig, ReplayConfig
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

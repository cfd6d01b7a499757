"""Dedicated replay placement on a real two-node Ray cluster on loopback (Ray's own test cluster).

One replay worker per node, each loading SmolLM2-135M-Instruct itself, dispatched by verl's
RayWorkerGroup (DP_COMPUTE_PROTO): the relevance must equal the in-process scorer's, and pushing
new weights must change it exactly as it changes the in-process result.
"""

from __future__ import annotations

import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.state import list_actors

from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.trainer.replay_stage import ReplayStage, build_request
from mrtpo_verl.workers.placement import DedicatedBackend, InProcessBackend, create_replay_worker_group
from tests.support.ray_groups import release
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch, smollm2

pytestmark = pytest.mark.slow

# The replay workers share prefixes (the default); the in-process reference replays every context in full.
CFG = MRTPOConfig(reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=4))
UNSHARED = MRTPOConfig(
    reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=4, share_prefix=False)
)


@pytest.fixture(scope="module")
def two_node_cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def in_process_relevance(data) -> torch.Tensor:
    model, tokenizer = smollm2()
    return InProcessBackend(UNSHARED, model, tokenizer).compute_relevance(request_of(data)).batch[RELEVANCE_KEY]


def request_of(data):
    """The request the stage sends (the backend plays no part in choosing the needed pairs)."""
    return build_request(data, CFG, ReplayStage(CFG, None, backend=None).needed_pairs(data))


@pytest.fixture
def group(two_node_cluster):
    """Two replay workers, one per node; released afterwards (the cluster has one CPU per node)."""
    group = create_replay_worker_group(CFG, model_path=None, process_on_nodes=[1, 1], device="cpu")
    yield group
    release(group)


def test_one_worker_per_node_gives_the_in_process_relevance(group, two_node_cluster, monkeypatch) -> None:
    data = real_sql_batch()
    assert group.world_size == 2
    # The state API reads its address from RAY_ADDRESS before its address argument; the session's
    # RAY_ADDRESS=local makes it auto-detect, which fails with "multiple active Ray instances" whenever the other
    # pytest worker runs a Ray instance of its own. So RAY_ADDRESS names this cluster here.
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    alive = list_actors(filters=[("state", "=", "ALIVE")])
    actors = [a for a in alive if a.class_name == "ReplayWorker"]
    assert len({a.node_id for a in actors}) == 2, "one replay worker on each node"
    assert all(a.name.startswith("mrtpo_replay") for a in actors), "shows as its own role in the dashboard"

    backend = DedicatedBackend(group)
    distributed = ReplayStage(CFG, None, backend).run(data, global_step=1)[0]
    torch.testing.assert_close(distributed, in_process_relevance(data), atol=1e-5, rtol=0)

    # Weight sync: scale one layer's weights in the driver's model, push them, and compare again.
    model, _ = smollm2()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
        backend.weight_source = lambda: {k: v.detach().clone() for k, v in model.state_dict().items()}
        relevance, metrics = ReplayStage(CFG, None, backend).run(data, global_step=2)
        assert metrics["mrtpo/replay/weight_sync_s"] > 0 and "mrtpo/replay/weight_load_s_max" in metrics
        assert not torch.allclose(relevance, distributed)
        torch.testing.assert_close(relevance, in_process_relevance(data), atol=1e-5, rtol=0)
    finally:
        model.load_state_dict(original)


def test_a_killed_worker_fails_the_step_with_its_name(group) -> None:
    """A real worker death (``ray.kill`` of the rank-1 actor), not a stand-in: the error names group, step, actor."""
    from mrtpo_verl.trainer.replay_stage import ReplayWorkerFailed

    data = real_sql_batch()
    ray.kill(group.workers[1])
    with pytest.raises(ReplayWorkerFailed, match=r"'mrtpo_replay' failed at global step 5: ActorDiedError") as raised:
        ReplayStage(CFG, None, DedicatedBackend(group)).run(data, global_step=5)
    # Which worker: verl's actor name of rank 1 (the one killed), and not rank 0's.
    assert f"no longer answering: {group.worker_names[1]} (rank 1))" in str(raised.value), str(raised.value)
    assert group.worker_names[0] not in str(raised.value)

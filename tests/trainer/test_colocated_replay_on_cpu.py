"""Colocated replay on verl's real actor worker: two FSDP2 ranks on gloo, one Ray worker group.

verl's ``ActorRolloutRefWorker`` (our subclass, role ``actor``) builds its real FSDP2 engine on CPU
through :mod:`mrtpo_verl.cpu_support`; ``compute_mrtpo_relevance`` then replays on the engine's
sharded model in place. Checked against the in-process scorer on the same weights:

- every pair needed: the same relevance (each rank scores its own rows);
- one row needed: one rank has work and the other none, so the idle rank must run idle forward
  passes to keep FSDP's all-gathers in step (without them the busy rank would wait forever);
- both a tied LM head (SmolLM2, in FSDP's root group) and an untied one (sharded on its own);
- prefix sharing on the colocated side (each shared prefix's cache built by a call of the wrapped root module,
  one more collective pass that every rank counts) against the unshared in-process path.

The only stand-in: Ray's placement groups ask for GPUs, so the cluster declares two logical GPUs;
every tensor lives on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from hydra import compose, initialize_config_module

from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.cpu_support.distributed import SETUP_HOOK
from mrtpo_verl.cpu_support.launch import CPU_ENV, cpu_overrides, save_derived_model
from mrtpo_verl.estimator import RELEVANCE_KEY
from mrtpo_verl.trainer.replay_stage import ReplayStage, build_request
from mrtpo_verl.workers.placement import ColocatedBackend, InProcessBackend
from mrtpo_verl.workers.replay_worker import RANK_TIME_KEY
from tests.support.ray_groups import release
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a collective out of step would hang: fail instead

RANKS = 2
# The colocated replay shares prefixes (the default, min_shared_tokens=1: the deepest tree, most collective calls);
# the in-process reference does not, so the check covers sharing on verl's FSDP2 engine against the plain path.
CFG = MRTPOConfig(
    reward_keys=REWARD_KEYS,
    verifier_info_keys=INFO_KEYS,
    replay=ReplayConfig(micro_batch_size=2, share_prefix=True, min_shared_tokens=1),
)
UNSHARED = MRTPOConfig(
    reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=2, share_prefix=False)
)


@pytest.fixture(scope="module")
def cpu_ray_cluster():
    ray.init(
        num_cpus=4,
        num_gpus=RANKS,  # logical: verl's resource pools place one worker per "GPU"
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": dict(CPU_ENV), "worker_process_setup_hook": SETUP_HOOK},
    )
    try:
        yield
    finally:
        ray.shutdown()


def untie_lm_head(model_dir: Path) -> Path:
    """The same weights with ``tie_word_embeddings=False``: FSDP2 then shards the LM head on its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    out = model_dir.parent / f"{model_dir.name}_untied"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["tied", "untied"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tied = save_derived_model(tmp_path_factory.mktemp("colocated") / "model", num_layers=2)
    return tied if request.param == "tied" else untie_lm_head(tied)


def actor_config(model_dir: Path) -> Any:
    overrides = cpu_overrides(
        model_path=model_dir,
        train_files="unused.parquet",
        val_files="unused.parquet",
        ckpt_dir=model_dir.parent / "ckpt",
        prompt_length=128,
        response_length=32,
        batch_size=2,
        n=2,
        total_steps=1,
        extra=(f"trainer.n_gpus_per_node={RANKS}",),
    )
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=overrides).actor_rollout_ref


@pytest.fixture(scope="module")
def actor_group(cpu_ray_cluster, model_dir: Path):
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker

    pool = RayResourcePool(process_on_nodes=[RANKS], use_gpu=True, max_colocate_count=1, name_prefix="colocated_test")
    worker = RayClassWithInitArgs(
        cls=ray.remote(MRTPOActorRolloutRefWorker), config=actor_config(model_dir), role="actor"
    )
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
    group.init_model()
    yield group
    release(group)  # frees the logical GPUs for the next model's group


@pytest.fixture(scope="module")
def in_process(model_dir: Path) -> InProcessBackend:
    from mrtpo_verl.replay.model_loading import load_causal_lm

    model, tokenizer = load_causal_lm(str(model_dir), dtype=torch.float32)
    return InProcessBackend(UNSHARED, model, tokenizer)


def test_all_pairs_match_the_in_process_scorer(actor_group, in_process: InProcessBackend) -> None:
    data = real_sql_batch()
    needed = ReplayStage(CFG, None, backend=None).needed_pairs(data)
    assert needed.all(), "the real batch has work for every pair"
    answer = ColocatedBackend(actor_group, CFG).compute_relevance(build_request(data, CFG, needed))
    expected = in_process.compute_relevance(build_request(data, CFG, needed))

    torch.testing.assert_close(answer.batch[RELEVANCE_KEY], expected.batch[RELEVANCE_KEY], atol=1e-5, rtol=0)
    assert float(answer.batch["mrtpo_forward_passes"].sum()) == len(data) * (1 + len(REWARD_KEYS))
    assert len(answer.meta_info["metrics"][RANK_TIME_KEY]) == RANKS  # both ranks worked and reported
    shared = float(answer.batch["mrtpo_prefix_tokens_shared"].sum())
    assert shared > 0 and float(expected.batch["mrtpo_prefix_tokens_shared"].sum()) == 0
    replayed = float(answer.batch["mrtpo_tokens_replayed"].sum())
    assert replayed + shared == float(expected.batch["mrtpo_tokens_replayed"].sum())  # same passes, fewer tokens


def test_a_rank_without_work_keeps_the_busy_rank_in_step(actor_group, in_process: InProcessBackend) -> None:
    data = real_sql_batch()
    needed = torch.zeros(len(data), len(REWARD_KEYS), dtype=torch.bool)
    needed[0] = True  # one row of work: after the balanced split one rank has all of it, the other none
    answer = ColocatedBackend(actor_group, CFG).compute_relevance(build_request(data, CFG, needed))
    expected = in_process.compute_relevance(build_request(data, CFG, needed))

    torch.testing.assert_close(answer.batch[RELEVANCE_KEY], expected.batch[RELEVANCE_KEY], atol=1e-5, rtol=0)
    assert (answer.batch[RELEVANCE_KEY][1:] == 0).all() and answer.batch[RELEVANCE_KEY][0].abs().sum() > 0
    assert float(answer.batch["mrtpo_forward_passes"].sum()) == 1 + len(REWARD_KEYS)
    # The three other rows were skipped whole; the padding rows are not counted.
    assert float(answer.batch["mrtpo_skipped_passes"].sum()) == (len(data) - 1) * (1 + len(REWARD_KEYS))


def test_a_rank_that_fails_before_its_passes_does_not_leave_the_other_waiting(actor_group) -> None:
    data = real_sql_batch()
    request = build_request(data, CFG, torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool))
    request.non_tensor_batch[INFO_KEYS[0]] = request.non_tensor_batch[INFO_KEYS[0]].copy()
    request.non_tensor_batch[INFO_KEYS[0]][3] = 123  # one row's verifier text is not a string: one rank fails
    with pytest.raises(Exception, match=r"must be a string or None, got int|another rank failed") as raised:
        ColocatedBackend(actor_group, CFG).compute_relevance(request)
    assert "Timeout" not in type(raised.value).__name__
    # The group is still usable: both ranks left the failed call in step.
    answer = ColocatedBackend(actor_group, CFG).compute_relevance(
        build_request(data, CFG, torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool))
    )
    assert float(answer.batch["mrtpo_forward_passes"].sum()) == len(data) * (1 + len(REWARD_KEYS))

"""The v1 trainer's advantage step on real TransferQueue data: verl's fails for gdpo, ours runs gdpo and mrtpo.

The batch (SmolLM2 answers to Spider questions, scored by our SQL verifier) is written to a real
TransferQueue on a local Ray instance, in the layout verl's agent loop and reward loop leave it
(nested prompt/response tensors, rm_scores, uid, and the reward function's extra keys). The
trainers are real verl trainer classes; only their heavy ``__init__`` (worker groups, rollout
servers, which need GPUs) is skipped by creating the objects with ``object.__new__`` and setting
the attributes ``_compute_advantage`` reads.
"""

from __future__ import annotations

import hashlib
import inspect

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1.trainer_base import PPOTrainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass

from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.estimator import RELEVANCE_KEY
from mrtpo_verl.startup import validate_run_config
from mrtpo_verl.trainer.mrtpo_trainer import MRTPOTrainer
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch, smollm2

pytestmark = pytest.mark.slow

#: sha256 of verl 0.9.1's PPOTrainer._compute_advantage source, which MRTPOTrainer._compute_advantage follows.
VERL_COMPUTE_ADVANTAGE_SHA256 = "2a4a2aa4a475b228d401959818e0b9019276ce27961c133961de217baa387da7"


def run_config(estimator: str):
    overrides = [
        f"algorithm.adv_estimator={estimator}",
        f"mrtpo.reward_keys=[{','.join(REWARD_KEYS)}]",
        f"mrtpo.verifier_info_keys=[{','.join(INFO_KEYS)}]",
        "mrtpo.warmup_steps=0",
        "mrtpo.replay.micro_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.temperature=1.0",
    ]
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def transfer_queue():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = OmegaConf.to_container(run_config("mrtpo").transfer_queue, resolve=True)
    config.update(enable=True)
    config["backend"]["SimpleStorage"].update(num_data_storage_units=1, total_storage_size=1000)
    tq.init(OmegaConf.create(config))
    try:
        yield
    finally:
        tq.close()
        ray.shutdown()


def put_batch(partition: str):
    """Write the real batch to TransferQueue as verl's rollout + reward stages leave it; → KVBatchMeta."""
    data = real_sql_batch()
    prompt_mask = data.batch["attention_mask"][:, : data.batch["prompts"].shape[1]].bool()
    response_mask = data.batch["response_mask"].bool()

    def nested(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    scores = data.non_tensor_batch["sql_format"] + data.non_tensor_batch["sql_execution"]
    rm_scores = []
    for i in range(len(data)):
        row = torch.zeros(int(response_mask[i].sum()))
        row[-1] = float(scores[i])
        rm_scores.append(row)
    fields = {
        "prompts": nested([data.batch["prompts"][i][prompt_mask[i]] for i in range(len(data))]),
        "responses": nested([data.batch["responses"][i][response_mask[i]] for i in range(len(data))]),
        "response_mask": nested([torch.ones(int(n), dtype=torch.long) for n in response_mask.sum(1)]),
        "rm_scores": nested(rm_scores),
    }
    for key in ("uid", "raw_prompt"):
        fields[key] = data.non_tensor_batch[key]
    # verl 0.9.1's agent loop keeps the reward function's outputs per sample in extra_fields["reward_extra_info"].
    extra = np.empty(len(data), dtype=object)
    extra[:] = [
        {"reward_extra_info": {k: data.non_tensor_batch[k][i] for k in (*REWARD_KEYS, *INFO_KEYS)}}
        for i in range(len(data))
    ]
    fields["extra_fields"] = extra
    keys = [f"{uid}_0_{i}" for i, uid in enumerate(data.non_tensor_batch["uid"])]
    return tq.kv_batch_put(keys=keys, partition_id=partition, fields=tu.get_tensordict(fields)), data


def bare_trainer(cls, estimator: str):
    trainer = object.__new__(cls)
    trainer.config = run_config(estimator)
    trainer.global_steps = 5
    return trainer


def advantages_in_queue(meta) -> torch.Tensor:
    got = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["advantages"])
    return got["advantages"].to_padded_tensor(0.0)


def test_upstream_method_we_follow_is_unchanged() -> None:
    source = inspect.getsource(PPOTrainer._compute_advantage)
    assert hashlib.sha256(source.encode()).hexdigest() == VERL_COMPUTE_ADVANTAGE_SHA256, (
        "verl's PPOTrainer._compute_advantage changed: re-read it and update MRTPOTrainer._compute_advantage"
    )


def test_verls_own_v1_trainer_cannot_run_gdpo(transfer_queue) -> None:
    """SPEC §4: the default trainer's advantage step builds a batch without gdpo's inputs."""
    meta, _ = put_batch("verl-gdpo")
    with pytest.raises(KeyError, match="prompts"):
        bare_trainer(PPOTrainerSync, "gdpo")._compute_advantage(meta, {})


def test_our_trainer_runs_verls_gdpo_on_the_reward_components(transfer_queue) -> None:
    meta, data = put_batch("our-gdpo")
    trainer = bare_trainer(MRTPOTrainer, "gdpo")
    trainer._compute_advantage(meta, {})
    algo = omega_conf_to_dataclass(trainer.config.algorithm)
    expected = compute_advantage(data.slice(0, len(data)), adv_estimator="gdpo", config=algo).batch["advantages"]
    torch.testing.assert_close(advantages_in_queue(meta), expected, atol=1e-6, rtol=0)


def test_our_trainer_runs_the_replay_and_mrtpo(transfer_queue) -> None:
    meta, data = put_batch("our-mrtpo")
    trainer = bare_trainer(MRTPOTrainer, "mrtpo")
    model, tokenizer = smollm2()
    cfg = validate_run_config(trainer.config)
    # In-process replay instead of a dedicated pool; the two are compared in test_two_node_replay_on_cpu.
    trainer.attach_mrtpo(
        replay_stage=ReplayStage(cfg, trainer.config.algorithm, InProcessBackend(cfg, model, tokenizer))
    )
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)

    # The same computation by hand: stage, then verl's compute_advantage in the context.
    relevance, _ = trainer.replay_stage.run(data, global_step=5)
    batch = data.slice(0, len(data))
    batch.batch[RELEVANCE_KEY] = relevance
    algo = omega_conf_to_dataclass(trainer.config.algorithm)
    with advantage_inputs(batch, cfg, global_step=5):
        expected = compute_advantage(batch, adv_estimator="mrtpo", config=algo).batch["advantages"]
    torch.testing.assert_close(advantages_in_queue(meta), expected, atol=1e-6, rtol=0)
    assert metrics["mrtpo/beta"] == 0.5
    assert metrics["mrtpo/replay/forward_passes"] == len(data) * 3
    assert {"mrtpo/replay/time_s", "mrtpo/replay/skip_fraction", "mrtpo/replay/tokens_per_s"} <= set(metrics)


def test_missing_reward_component_is_a_clear_error(transfer_queue) -> None:
    meta, _ = put_batch("missing-key")
    trainer = bare_trainer(MRTPOTrainer, "gdpo")
    trainer.config.mrtpo.reward_keys = [*REWARD_KEYS, "sql_executability"]
    trainer.config.mrtpo.verifier_info_keys = [*INFO_KEYS, "sql_executability_info"]
    with pytest.raises(KeyError, match=r"no field\(s\) \['sql_executability'\]"):
        trainer._compute_advantage(meta, {})


def test_other_estimators_use_verls_method_unchanged(transfer_queue) -> None:
    meta, _ = put_batch("grpo")
    trainer = bare_trainer(MRTPOTrainer, "grpo")
    trainer._compute_advantage(meta, {})
    assert np.isfinite(advantages_in_queue(meta).numpy()).all()

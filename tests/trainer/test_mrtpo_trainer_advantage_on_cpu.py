"""The v1 trainers' advantage step on real TransferQueue data, for every registered mode.

verl's own step fails for gdpo; ours (``mrtpo_sync``, ``mrtpo_colocate_async``,
``mrtpo_separate_async``: one step, three verl bases) runs gdpo and mrtpo, reports per-reward
figures and staleness, and normalises a split prompt group as verl does (or stops, when asked).
The batch (SmolLM2 answers to Spider questions, scored by our SQL verifier) is written to a real
TransferQueue on a local Ray instance, in the layout and under the keys verl's agent loop and
reward loop leave it (nested prompt/response tensors, rm_scores, uid, ``{uid}_{session}_{index}``
keys with their tags, and the reward function's extra keys). The trainers are built by their real
``__init__`` (config, replay buffer); ``init()`` (worker groups, rollout servers, which need GPUs)
is not called.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from typing import ClassVar

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass

from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.batch_keys import NEEDED_KEY, RELEVANCE_KEY
from mrtpo_verl.math.token_weights import beta_at_step
from mrtpo_verl.startup import TRAINER_MODES, validate_run_config
from mrtpo_verl.trainer.advantage_step import MRTPOStep
from mrtpo_verl.trainer.group_completeness import IncompleteGroupError
from mrtpo_verl.trainer.mrtpo_trainer import TRAINER_CLASSES, MRTPOSeparateAsyncTrainer
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch, smollm2
from tests.support.trainer_overrides import SEPARATE_ASYNC_RULES

pytestmark = pytest.mark.slow

MODES = sorted(TRAINER_CLASSES)
GLOBAL_STEP = 5


def run_config(estimator: str, mode: str = "mrtpo_sync"):
    overrides = [
        f"trainer.v1.trainer_mode={mode}",
        f"algorithm.adv_estimator={estimator}",
        f"mrtpo.reward_keys=[{','.join(REWARD_KEYS)}]",
        f"mrtpo.verifier_info_keys=[{','.join(INFO_KEYS)}]",
        "mrtpo.warmup_steps=0",
        "mrtpo.replay.micro_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.temperature=1.0",
        *SEPARATE_ASYNC_RULES,
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


@functools.cache
def _generated_batch():
    return real_sql_batch()


def real_batch():
    """The real batch (generated once per module: SmolLM2 generation takes most of a minute here), copied."""
    return copy.deepcopy(_generated_batch())


class ReplayOnce:
    """The real in-process replay; an identical request (every mode sends the same one) is scored once.

    The replay of this batch takes the better part of a minute on two shared cores; what differs
    between the modes is the trainer step around it, which each test runs in full.
    """

    name = "in-process (memoised per request)"
    answers: ClassVar[dict[str, object]] = {}

    def __init__(self, cfg) -> None:
        model, tokenizer = smollm2()
        self.inner = InProcessBackend(cfg, model, tokenizer)

    def compute_relevance(self, request):
        digest = hashlib.sha256()
        for key in ("prompts", "responses", "response_mask", NEEDED_KEY):
            digest.update(request.batch[key].numpy().tobytes())
        key = digest.hexdigest()
        if key not in self.answers:
            self.answers[key] = self.inner.compute_relevance(request)
        return copy.deepcopy(self.answers[key])


def session_keys(uids) -> list[str]:
    """verl's trajectory keys ``{uid}_{session_id}_{index}``: session = position in the uid's group."""
    seen: dict[str, int] = {}
    keys = []
    for uid in uids:
        keys.append(f"{uid}_{seen.get(uid, 0)}_0")
        seen[uid] = seen.get(uid, 0) + 1
    return keys


def trajectory_tags(count: int) -> list[dict]:
    """The tags verl's agent loop writes; rows alternate between weight versions 3 and 4 (staleness 1 and 0)."""
    return [
        {"status": "success", "global_steps": 3, "min_global_steps": 3, "max_global_steps": 3 + i % 2}
        for i in range(count)
    ]


def put_batch(partition: str):
    """Write the real batch to TransferQueue as verl's rollout + reward stages leave it; → KVBatchMeta."""
    data = real_batch()
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
    keys = session_keys(data.non_tensor_batch["uid"])
    tags = trajectory_tags(len(keys))
    return tq.kv_batch_put(keys=keys, partition_id=partition, fields=tu.get_tensordict(fields), tags=tags), data


def trainer_for(mode: str, estimator: str):
    """The registered class, built by its real __init__ (no worker groups), at global step 5."""
    trainer = get_trainer_cls(mode)(run_config(estimator, mode))
    trainer.global_steps = GLOBAL_STEP
    return trainer


def bare_trainer(cls, estimator: str):
    """verl's own trainer class without __init__ (which would start a replay buffer we do not need)."""
    trainer = object.__new__(cls)
    trainer.config = run_config(estimator)
    trainer.global_steps = GLOBAL_STEP
    return trainer


def advantages_in_queue(meta) -> torch.Tensor:
    got = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["advantages"])
    return got["advantages"].to_padded_tensor(0.0)


def test_verls_own_v1_trainer_cannot_run_gdpo(transfer_queue) -> None:
    """The default trainer's advantage step builds a batch without gdpo's inputs."""
    meta, _ = put_batch("verl-gdpo")
    with pytest.raises(KeyError, match="prompts"):
        bare_trainer(PPOTrainerSync, "gdpo")._compute_advantage(meta, {})


def test_the_advantage_step_is_written_once_and_registered_per_mode() -> None:
    assert {name: cls.verl_mode for name, cls in TRAINER_CLASSES.items()} == TRAINER_MODES
    for name, cls in TRAINER_CLASSES.items():
        assert get_trainer_cls(name) is cls
        assert cls.advantage_step is MRTPOStep.advantage_step
        # The verl class of the mode follows the mixins: every other stage is verl's.
        assert cls.__mro__[3] is get_trainer_cls(cls.verl_mode)


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_behaves_as_the_verl_mode_it_extends(mode: str) -> None:
    """verl branches on trainer_mode == "sync" and reads trainer.v1.<mode>: ours must read as verl's mode."""
    trainer = get_trainer_cls(mode)(run_config("mrtpo", mode))
    assert trainer.trainer_mode == TRAINER_MODES[mode] and trainer.registered_mode == mode
    expected_buffer = ReplayBuffer if TRAINER_MODES[mode] == "sync" else ReplayBufferAsync
    assert type(trainer.replay_buffer) is expected_buffer
    assert trainer.parameter_sync_step == (2 if mode == "mrtpo_separate_async" else 1)


def expected_reward_metrics(data) -> dict[str, float]:
    """reward/<key>/... by hand with numpy; groups are the uids."""
    uids = data.non_tensor_batch["uid"]
    metrics = {}
    for key in REWARD_KEYS:
        values = np.asarray(data.non_tensor_batch[key], dtype=np.float64)
        groups = [values[uids == uid] for uid in dict.fromkeys(uids)]
        metrics |= {
            f"reward/{key}/mean": values.mean(),
            f"reward/{key}/std": values.std(),
            f"reward/{key}/min": values.min(),
            f"reward/{key}/max": values.max(),
            f"reward/{key}/zero_variance_group_share": np.mean([float(np.ptp(g) == 0) for g in groups]),
        }
    return metrics


@pytest.mark.parametrize("mode", MODES)
def test_our_trainer_runs_verls_gdpo_on_the_reward_components(transfer_queue, mode: str) -> None:
    meta, data = put_batch(f"our-gdpo-{mode}")
    trainer = trainer_for(mode, "gdpo")
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)
    algo = omega_conf_to_dataclass(trainer.config.algorithm)
    expected = compute_advantage(data.slice(0, len(data)), adv_estimator="gdpo", config=algo).batch["advantages"]
    torch.testing.assert_close(advantages_in_queue(meta), expected, atol=1e-6, rtol=0)
    for name, value in expected_reward_metrics(data).items():
        assert metrics[name] == pytest.approx(value, abs=1e-9), name
    # verl's staleness, (step - 1) - max_global_steps: rows of version 3 lag 1, rows of version 4 lag 0.
    assert metrics["mrtpo/staleness/mean"] == pytest.approx(0.5) and metrics["mrtpo/staleness/max"] == 1.0


@pytest.mark.parametrize("mode", MODES)
def test_our_trainer_runs_the_replay_and_mrtpo(transfer_queue, mode: str) -> None:
    meta, data = put_batch(f"our-mrtpo-{mode}")
    trainer = trainer_for(mode, "mrtpo")
    trainer.config.mrtpo.warmup_steps = 10  # β_s = β · smoothstep(5 / 10) = 0.25: the step's own global step
    cfg = validate_run_config(trainer.config)
    # In-process replay instead of a dedicated pool; the two are compared in test_two_node_replay_on_cpu.
    trainer.attach_mrtpo(replay_stage=ReplayStage(cfg, trainer.config.algorithm, ReplayOnce(cfg)))
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)

    # The same computation by hand: stage, then verl's compute_advantage in the context.
    relevance, _ = trainer.replay_stage.run(data, global_step=GLOBAL_STEP)
    batch = data.slice(0, len(data))
    batch.batch[RELEVANCE_KEY] = relevance
    algo = omega_conf_to_dataclass(trainer.config.algorithm)
    with advantage_inputs(batch, cfg, global_step=GLOBAL_STEP):
        expected = compute_advantage(batch, adv_estimator="mrtpo", config=algo).batch["advantages"]
    torch.testing.assert_close(advantages_in_queue(meta), expected, atol=1e-6, rtol=0)
    assert metrics["mrtpo/beta"] == beta_at_step(0.5, 10, GLOBAL_STEP) == 0.25
    assert metrics["reward/sql_execution/mean"] == pytest.approx(
        expected_reward_metrics(data)["reward/sql_execution/mean"]
    )
    assert metrics["mrtpo/replay/forward_passes"] == len(data) * 3
    assert {"mrtpo/replay/time_s", "mrtpo/replay/skip_fraction", "mrtpo/replay/tokens_per_s"} <= set(metrics)


def test_missing_reward_component_is_a_clear_error(transfer_queue) -> None:
    meta, _ = put_batch("missing-key")
    trainer = trainer_for("mrtpo_sync", "gdpo")
    trainer.config.mrtpo.reward_keys = [*REWARD_KEYS, "sql_executability"]
    trainer.config.mrtpo.verifier_info_keys = [*INFO_KEYS, "sql_executability_info"]
    with pytest.raises(KeyError, match=r"no field\(s\) \['sql_executability'\]"):
        trainer._compute_advantage(meta, {})


def test_other_estimators_use_verls_method_unchanged(transfer_queue) -> None:
    meta, _ = put_batch("grpo")
    trainer = trainer_for("mrtpo_sync", "grpo")
    trainer._compute_advantage(meta, {})
    assert np.isfinite(advantages_in_queue(meta).numpy()).all()


def sampled_split_group(mode: str, estimator: str, policy: str):
    """A finished prompt whose session 1 left no trajectory (verl's agent loop on an empty output), sampled by
    verl's own replay buffer of the mode; → (trainer, sampled batch, full data, missing key)."""
    data = real_batch()
    partition = f"split-{mode}-{estimator}-{policy}"
    meta, _ = put_batch(partition)
    missing = meta.keys[-1]  # the second group's session 1
    tq.kv_clear(keys=[missing], partition_id=partition)
    uids = list(dict.fromkeys(data.non_tensor_batch["uid"].tolist()))
    prompt_tags = [{"is_prompt": True, "status": "finished", "global_steps": 4} for _ in uids]
    tq.kv_batch_put(keys=uids, partition_id=partition, tags=prompt_tags)
    trainer = trainer_for(mode, estimator)
    trainer.config.mrtpo.on_incomplete_group = policy
    sampled, _ = trainer.replay_buffer.sample(global_steps=GLOBAL_STEP, partition_id=partition, batch_size=len(uids))
    assert sorted(sampled.keys) == sorted(set(meta.keys) - {missing})  # verl hands the partial group over
    return trainer, sampled, data, missing


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("estimator", ["gdpo", "mrtpo"])
def test_a_split_group_stops_the_step_when_asked(transfer_queue, mode: str, estimator: str) -> None:
    trainer, sampled, _, missing = sampled_split_group(mode, estimator, "error")
    trainer.attach_mrtpo(replay_stage=object())  # the step must stop before any replay
    uid = missing.rsplit("_", 2)[0]
    with pytest.raises(IncompleteGroupError, match=rf"uid '{uid}': sessions \[0\] present, \[1\] missing"):
        trainer._compute_advantage(sampled, {})


@pytest.mark.parametrize(("mode", "estimator"), [*((mode, "gdpo") for mode in MODES), ("mrtpo_sync", "mrtpo")])
def test_a_split_group_is_normalised_as_verl_does_and_counted(
    transfer_queue, mode: str, estimator: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Default: the step goes on; the advantages are verl's compute_advantage on the rows present."""
    trainer, sampled, data, missing = sampled_split_group(mode, estimator, "normalise")
    cfg = validate_run_config(trainer.config)
    if estimator == "mrtpo":
        trainer.attach_mrtpo(replay_stage=ReplayStage(cfg, trainer.config.algorithm, ReplayOnce(cfg)))
    metrics: dict = {}
    with caplog.at_level("WARNING", logger="mrtpo_verl.trainer.advantage_step"):
        trainer._compute_advantage(sampled, metrics)
    assert metrics["mrtpo/groups/incomplete"] == 1.0
    assert metrics["mrtpo/groups/incomplete_rows"] == metrics["mrtpo/groups/single_response_rows"] == 1.0
    assert "normalised over the responses present" in caplog.text and missing.rsplit("_", 2)[0] in caplog.text

    # By hand: the rows present, in the order the sampler returned them, through verl's compute_advantage.
    keys = session_keys(data.non_tensor_batch["uid"])
    present = data.select_idxs([keys.index(key) for key in sampled.keys])
    algo = omega_conf_to_dataclass(trainer.config.algorithm)
    if estimator == "mrtpo":
        relevance, _ = trainer.replay_stage.run(present, global_step=GLOBAL_STEP)
        present.batch[RELEVANCE_KEY] = relevance
        with advantage_inputs(present, cfg, global_step=GLOBAL_STEP):
            expected = compute_advantage(present, adv_estimator="mrtpo", config=algo).batch["advantages"]
    else:
        expected = compute_advantage(present, adv_estimator="gdpo", config=algo).batch["advantages"]
    got = tq.kv_batch_get(keys=sampled.keys, partition_id=sampled.partition_id, select_fields=["advantages"])
    got = got["advantages"].to_padded_tensor(0.0)
    # The step pads to the longest response present; the full batch's padding beyond it holds zeros.
    assert torch.count_nonzero(expected[:, got.shape[1] :]) == 0
    torch.testing.assert_close(got, expected[:, : got.shape[1]], atol=1e-6, rtol=0)


class RecordingActorGroup:
    """Stands in for the actor worker group (FSDP workers need the CPU trainer run); records the weight swaps."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __getattr__(self, name: str):
        return lambda n: self.calls.append((name, n))


def test_separate_async_replays_with_the_weights_of_old_log_probs() -> None:
    """Mini-step i ≥ 1 of a sync cycle: verl computes old_log_probs with π_old (CPU slot 0); so does the replay."""
    trainer = trainer_for("mrtpo_separate_async", "mrtpo")
    trainer.actor_rollout_wg = RecordingActorGroup()
    trainer.local_trigger_step = 1
    with trainer._replay_weights():
        trainer.actor_rollout_wg.calls.append(("replay", 1))
    assert trainer.actor_rollout_wg.calls == [
        ("save_model_to_cpu", 1),
        ("restore_model_from_cpu", 0),
        ("replay", 1),
        ("restore_model_from_cpu", 1),
        ("clear_cpu_model", 1),
    ]
    trainer.actor_rollout_wg.calls.clear()
    trainer.local_trigger_step = 0  # the cycle's first mini-step: the current weights are π_old
    with trainer._replay_weights():
        pass
    assert trainer.actor_rollout_wg.calls == []
    assert isinstance(trainer, MRTPOSeparateAsyncTrainer)

"""Start-up validation per v1 trainer mode, the group-completeness rule and the per-reward figures (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_module

from mrtpo_verl.config import MRTPOConfigError
from mrtpo_verl.metrics import reward_component_metrics, staleness_metrics
from mrtpo_verl.ray_metrics import gauge_name_and_tags
from mrtpo_verl.startup import TRAINER_MODES, validate_run_config
from mrtpo_verl.trainer.group_completeness import IncompleteGroupError, check_whole_groups

SEPARATE_ASYNC_OK = (
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "trainer.v1.separate_async.parameter_sync_step=4",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
)


def config(*overrides: str, estimator: str = "mrtpo"):
    base = [
        f"algorithm.adv_estimator={estimator}",
        "mrtpo.reward_keys=[a,b]",
        "mrtpo.verifier_info_keys=[a_info,b_info]",
        "actor_rollout_ref.rollout.n=4",
    ]
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=[*base, *overrides])


@pytest.mark.parametrize("mode", sorted(TRAINER_MODES))
@pytest.mark.parametrize("estimator", ["mrtpo", "gdpo"])
def test_every_registered_mode_is_accepted(mode: str, estimator: str) -> None:
    extra = SEPARATE_ASYNC_OK if TRAINER_MODES[mode] == "separate_async" else ()
    assert validate_run_config(config(f"trainer.v1.trainer_mode={mode}", *extra, estimator=estimator)) is not None


#: verl's async-trainer options, each honoured by the MRTPO trainers (docs/design.md "verl's async options").
ASYNC_OPTIONS = (
    "algorithm.rollout_correction.bypass_mode=true",
    "trainer.v1.colocate_async.num_warmup_batches=2",
    "trainer.v1.separate_async.num_warmup_batches=1.5",
    "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
    "actor_rollout_ref.hybrid_engine=false",
)


@pytest.mark.parametrize("mode", sorted(TRAINER_MODES))
@pytest.mark.parametrize("option", ASYNC_OPTIONS)
def test_verls_async_options_are_accepted_in_every_mode(mode: str, option: str) -> None:
    extra = SEPARATE_ASYNC_OK if TRAINER_MODES[mode] == "separate_async" else ()
    assert validate_run_config(config(f"trainer.v1.trainer_mode={mode}", *extra, option)) is not None


@pytest.mark.parametrize("bypass", [True, False])
def test_separate_async_replays_with_current_weights_in_bypass_mode(bypass: bool) -> None:
    """Bypass: old_log_probs are the rollout's, so no π_old swap (the worker group is never touched); otherwise
    a mini-step ≥ 1 swaps π_old in through the worker group (absent here, hence the AttributeError)."""
    from mrtpo_verl.trainer.mrtpo_trainer import MRTPOSeparateAsyncTrainer

    trainer = object.__new__(MRTPOSeparateAsyncTrainer)
    bypass_override = f"algorithm.rollout_correction.bypass_mode={str(bypass).lower()}"
    trainer.config = config("trainer.v1.trainer_mode=mrtpo_separate_async", *SEPARATE_ASYNC_OK, bypass_override)
    trainer.local_trigger_step, trainer.actor_rollout_wg = 1, None
    if bypass:
        with trainer._replay_weights():
            pass
    else:
        with pytest.raises(AttributeError, match="save_model_to_cpu"), trainer._replay_weights():
            pass


@pytest.mark.parametrize("verl_mode", ["sync", "colocate_async", "separate_async"])
def test_verls_own_mode_names_ours(verl_mode: str) -> None:
    with pytest.raises(MRTPOConfigError, match=rf"trainer_mode: '{verl_mode}'.*use 'mrtpo_{verl_mode}'"):
        validate_run_config(config(f"trainer.v1.trainer_mode={verl_mode}"))


def test_separate_async_batch_rule_names_the_mode_and_the_numbers() -> None:
    overrides = ("trainer.v1.trainer_mode=mrtpo_separate_async", *SEPARATE_ASYNC_OK[1:], "data.train_batch_size=6")
    with pytest.raises(MRTPOConfigError, match=r"trainer_mode=mrtpo_separate_async.*parameter_sync_step: 4.*=6"):
        validate_run_config(config(*overrides))


def test_separate_async_needs_a_checkpoint_engine() -> None:
    overrides = ("trainer.v1.trainer_mode=mrtpo_separate_async", *SEPARATE_ASYNC_OK[:3])
    with pytest.raises(MRTPOConfigError, match=r"backend: 'naive' with trainer_mode=mrtpo_separate_async"):
        validate_run_config(config(*overrides, "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"))


def test_the_legacy_trainer_is_refused_for_mrtpo_with_the_reason() -> None:
    with pytest.raises(MRTPOConfigError, match=r"trainer.use_v1: false with adv_estimator=mrtpo.*without copying fit"):
        validate_run_config(config("trainer.use_v1=false"))
    # verl's own gdpo runs on the legacy trainer: not refused.
    assert validate_run_config(config("trainer.use_v1=false", estimator="gdpo")) is not None


def keys_of(groups: dict[str, list[int]]) -> list[str]:
    return [f"{uid}_{session}_0" for uid, sessions in groups.items() for session in sessions]


def test_whole_groups_pass_and_padding_is_not_a_group() -> None:
    keys = [*keys_of({"u1": [0, 1, 2], "u2": [2, 0, 1]}), "padabc_0_0", "padabc_1_0"]
    tags = [{}] * 6 + [{"is_padding": True}] * 2
    check_whole_groups(keys, tags, n=3, mode="mrtpo_sync")


def test_a_split_group_is_named() -> None:
    keys = keys_of({"u1": [0, 1, 2], "u_2": [0, 2]})
    with pytest.raises(IncompleteGroupError, match=r"1 of 2 .* mrtpo_colocate_async .*uid 'u_2': sessions \[0, 2\] "):
        check_whole_groups(keys, [{}] * len(keys), n=3, mode="mrtpo_colocate_async")


def test_a_session_beyond_rollout_n_is_named() -> None:
    keys = keys_of({"u1": [0, 1, 2]})
    with pytest.raises(IncompleteGroupError, match=r"\[2\] beyond rollout.n"):
        check_whole_groups(keys, [{}] * 3, n=2, mode="mrtpo_sync")


def test_reward_component_metrics_by_hand() -> None:
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0], [1.0, 2.0]])
    index = np.array(["g0", "g0", "g1", "g1"], dtype=object)
    metrics = reward_component_metrics(rewards, index, ("fmt", "exec"))
    assert metrics["reward/fmt/mean"] == 0.75 and metrics["reward/exec/mean"] == 1.25
    assert metrics["reward/fmt/std"] == pytest.approx(np.std([1, 1, 0, 1]))
    assert (metrics["reward/fmt/min"], metrics["reward/fmt/max"]) == (0.0, 1.0)
    # fmt is constant in g0 only; exec constant in g1 only.
    assert metrics["reward/fmt/zero_variance_group_share"] == 0.5
    assert metrics["reward/exec/zero_variance_group_share"] == 0.5
    assert gauge_name_and_tags("reward/fmt/zero_variance_group_share") == (
        "mrtpo_reward_zero_variance_group_share",
        {"reward": "fmt"},
    )


def test_staleness_is_verls_formula_and_skips_padding() -> None:
    # (step - 1) - max_global_steps: 9 - 7 = 2 and 9 - 9 = 0.
    tags = [{"max_global_steps": 7}, {"max_global_steps": 9}, {"is_padding": True}]
    assert staleness_metrics(tags, global_step=10) == {"mrtpo/staleness/mean": 1.0, "mrtpo/staleness/max": 2.0}
    assert gauge_name_and_tags("mrtpo/staleness/mean") == ("mrtpo_staleness_mean", {})


def test_our_separate_async_worker_has_verls_and_our_methods() -> None:
    from verl.experimental.separation.engine_workers import DetachActorWorker

    from mrtpo_verl.trainer.actor_workers import MRTPODetachActorWorker, mrtpo_actor_class

    assert mrtpo_actor_class(DetachActorWorker) is MRTPODetachActorWorker
    for name in ("save_model_to_cpu", "restore_model_from_cpu", "clear_cpu_model", "compute_mrtpo_relevance"):
        assert callable(getattr(MRTPODetachActorWorker, name)), name
    assert mrtpo_actor_class(object) is None


def test_relevance_metrics_read_in_row_blocks_equal_the_whole_batch_formula() -> None:
    """150 rows (more than two blocks), K=2, random lengths and needed pairs: mean and top-10% share by hand."""
    from mrtpo_verl.metrics import METRIC_ROW_BLOCK, relevance_metrics, top_share

    generator = torch.Generator().manual_seed(3)
    bs, length = 150, 40
    assert bs > 2 * METRIC_ROW_BLOCK
    relevance = torch.rand(bs, 2, length, generator=generator)
    lengths = torch.randint(1, length + 1, (bs,), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    needed = torch.rand(bs, 2, generator=generator) > 0.3
    got = relevance_metrics(relevance, mask, needed, ("a", "b"))
    for k, key in enumerate(("a", "b")):
        q, v = relevance[needed[:, k], k], mask[needed[:, k]].bool()
        assert got[f"mrtpo/{key}/relevance_mean"] == pytest.approx(float(q[v].double().mean()), rel=1e-9)
        shares = top_share(q, v)
        assert got[f"mrtpo/{key}/relevance_top10_share"] == pytest.approx(float(shares.double().mean()), rel=1e-6)

"""verl 0.9.1's ``separate_async`` v1 trainer with MRTPO and GDPO, end to end on CPU.

The CPU backend and data of ``test_verl_trainer_on_cpu.py`` with
``trainer.v1.trainer_mode=mrtpo_separate_async``: verl's ``PPOTrainerSeparateAsync`` starts a
standalone ``hf`` rollout replica on its own (logical) GPU bundle behind verl's
``CheckpointEngineWorker``, next to the hybrid replica in the actor's processes; after every step
the actor's weights reach the standalone replica through the ``gloo`` checkpoint engine
(``mrtpo_cpu/gloo_checkpoint_engine.py``, registered in verl's
``CheckpointEngineRegistry`` and named by ``checkpoint_engine.custom_backend_module``). Each step is
``parameter_sync_step=2`` mini-steps of 2 prompts x 4 responses on verl's ``DetachActorWorker``
(π_old parked on the CPU for mini-step 2). Runs: ``mrtpo`` for 2 steps and ``gdpo`` for 1.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mrtpo_cpu.launch import separate_async_overrides
from mrtpo_cpu.rollout import WEIGHTS_LOADED
from tests.cpu_run.test_verl_trainer_on_cpu import (
    BATCH,
    WARMUP_STEPS,
    N,
    require_success,
    run_trainer,
    write_run_inputs,
)

pytestmark = pytest.mark.slow

STEPS = 2
STANDALONE_REPLICA = 1  # verl numbers the standalone replicas after the hybrid ones (one here)
SEPARATE = tuple(separate_async_overrides(batch_size=BATCH, n=N, parameter_sync_step=2))
LOADED = re.compile(re.escape(WEIGHTS_LOADED) + r" replica=(-?\d+) global_steps=(\S+) version=(\d+) checksum=(\S+)")


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run_inputs(tmp_path_factory.mktemp("cpu_separate_async_run"))


@pytest.fixture(scope="module")
def mrtpo_run(setup_dir: Path) -> dict:
    extra = (
        *SEPARATE,
        f"trainer.save_freq={STEPS}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    )
    return run_trainer(setup_dir, "mrtpo", "mrtpo", STEPS, extra=extra, logical_gpus=2)


def standalone_loads(log: str) -> list[tuple[str, int, float]]:
    """(global_steps, version, checksum) of each weight load the standalone replica's server logged."""
    return [
        (steps, int(version), float(checksum))
        for replica, steps, version, checksum in LOADED.findall(log)
        if int(replica) == STANDALONE_REPLICA
    ]


def checksum_of(model_dir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    from mrtpo_cpu.rollout import parameter_checksum

    return parameter_checksum(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))


def test_mrtpo_runs_real_separate_async_steps(mrtpo_run: dict) -> None:
    run = require_success(mrtpo_run)
    assert sorted(run["metrics"]) == [1, 2]
    for step, data in run["metrics"].items():
        u = step / WARMUP_STEPS
        assert data["mrtpo/beta"] == pytest.approx(0.5 * (3 * u**2 - 2 * u**3))  # the trainer's global step
        assert "mrtpo/replay/forward_passes" in data and "mrtpo/if_c0/weight_max" in data
        assert {f"reward/if_c0/{s}" for s in ("mean", "std", "min", "max", "zero_variance_group_share")} <= set(data)
        assert data["mrtpo/staleness/mean"] == pytest.approx(data["training/off_policy/trajectory_staleness/mean"])
        for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor"):
            assert key in data, f"step {step}: {key} not logged"
        # verl's standalone weight push ran through our engine (its per-sync figure reaches the trainer).
        assert data["timing_s/update_weights"] > 0 and data["gloo_checkpoint_engine/buckets"] >= 2
    assert any(data["actor/grad_norm"] > 0 for data in run["metrics"].values())


def test_standalone_rollout_received_the_trained_weights(mrtpo_run: dict, setup_dir: Path) -> None:
    run = require_success(mrtpo_run)
    loads = standalone_loads(run["log"])
    # verl pushes at start-up (on_init_end, step 0) and after each step's update.
    assert [steps for steps, _, _ in loads] == ["0", "1", "2"], loads
    assert [version for _, version, _ in loads] == [1, 2, 3]
    initial, final = (
        checksum_of(setup_dir / "model"),
        checksum_of(run["dir"] / "ckpt" / f"global_step_{STEPS}" / "actor" / "huggingface"),
    )
    assert initial != final, "the actor's parameters did not change"
    assert loads[0][2] == pytest.approx(initial, rel=1e-12, abs=1e-9)  # the start-up push: the initial model
    assert loads[-1][2] == pytest.approx(final, rel=1e-12, abs=1e-9)  # the last push: the trained actor's weights


def test_gdpo_runs_on_separate_async(setup_dir: Path) -> None:
    run = require_success(run_trainer(setup_dir, "gdpo", "gdpo", 1, extra=SEPARATE, logical_gpus=2))
    assert sorted(run["metrics"]) == [1]
    data = run["metrics"][1]
    assert "timing_s/update_actor" in data and "reward/if_c0/mean" in data
    assert data["gloo_checkpoint_engine/buckets"] >= 2
    assert not any(key.startswith("mrtpo/replay/") for key in data)
    assert [steps for steps, _, _ in standalone_loads(run["log"])] == ["0", "1"]

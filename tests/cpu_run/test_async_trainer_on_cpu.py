"""verl 0.9.1's ``colocate_async`` v1 trainer with MRTPO and GDPO, end to end on CPU, and a resume.

The same CPU backend and data as ``test_verl_trainer_on_cpu.py`` with
``trainer.v1.trainer_mode=mrtpo_colocate_async``: verl's asynchronous trainer prefetches the next
batch while training, aborts unfinished requests when a step's sampling ends and resumes them after
the weight push (partial rollouts, served by the ``hf`` rollout's abort/resume), samples with
verl's ``ReplayBufferAsync`` and checkpoints TransferQueue. Runs: ``mrtpo`` for 2 steps
(checkpoint at each), a resume from step 1, and ``gdpo`` for 1 step. ``separate_async`` runs in
``test_separate_async_trainer_on_cpu.py`` (weights pushed by the ``gloo`` checkpoint engine).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cpu_run.test_verl_trainer_on_cpu import (
    WARMUP_STEPS,
    require_success,
    run_trainer,
    write_run_inputs,
)

pytestmark = pytest.mark.slow

STEPS = 2
ASYNC = ("trainer.v1.trainer_mode=mrtpo_colocate_async", "trainer.val_before_train=False", "trainer.test_freq=-1")


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run_inputs(tmp_path_factory.mktemp("cpu_async_run"))


@pytest.fixture(scope="module")
def mrtpo_run(setup_dir: Path) -> dict:
    return run_trainer(setup_dir, "mrtpo", "mrtpo", STEPS, extra=(*ASYNC, "trainer.save_freq=1"))


def beta(step: int) -> float:
    u = step / WARMUP_STEPS
    return 0.5 * (3 * u**2 - 2 * u**3)


def test_mrtpo_runs_real_colocate_async_steps(mrtpo_run: dict) -> None:
    run = require_success(mrtpo_run)
    assert sorted(run["metrics"]) == [1, 2]
    for step, data in run["metrics"].items():
        assert data["mrtpo/beta"] == pytest.approx(beta(step))  # the trainer's global step, as in sync
        assert data["mrtpo/replay/forward_passes"] >= 0 and "mrtpo/if_c0/weight_max" in data
        # Per-reward training figures and verl's staleness (ours equals verl's figure for the same batch).
        assert {f"reward/if_c0/{s}" for s in ("mean", "std", "min", "max", "zero_variance_group_share")} <= set(data)
        assert data["mrtpo/staleness/mean"] == pytest.approx(data["training/off_policy/trajectory_staleness/mean"])
        # verl's colocate_async stages: weights pushed to the rollout after every update.
        for key in ("timing_s/gen", "timing_s/adv", "timing_s/update_actor", "timing_s/update_weights"):
            assert key in data, f"step {step}: {key} not logged"
    # The async mode checkpoints TransferQueue (in-flight prompts survive a restart): verl's mode, not sync's.
    assert (run["dir"] / "ckpt" / "global_step_1" / "transfer_queue").is_dir()


def test_resume_from_step_1_continues_the_schedule(mrtpo_run: dict, setup_dir: Path) -> None:
    first = require_success(mrtpo_run)
    checkpoint = first["dir"] / "ckpt" / "global_step_1"
    resumed = require_success(
        run_trainer(
            setup_dir,
            "mrtpo_resumed",
            "mrtpo",
            STEPS,
            extra=(*ASYNC, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"),
        )
    )
    assert sorted(resumed["metrics"]) == [2]
    assert resumed["metrics"][2]["mrtpo/beta"] == first["metrics"][2]["mrtpo/beta"] == pytest.approx(beta(2))
    assert "Restored" in resumed["log"] and "prompt groups from TransferQueue" in resumed["log"]


def test_gdpo_runs_on_colocate_async(setup_dir: Path) -> None:
    run = require_success(run_trainer(setup_dir, "gdpo", "gdpo", 1, extra=ASYNC))
    assert sorted(run["metrics"]) == [1]
    data = run["metrics"][1]
    assert "timing_s/update_actor" in data and "reward/if_c0/mean" in data
    assert not any(key.startswith("mrtpo/replay/") for key in data)

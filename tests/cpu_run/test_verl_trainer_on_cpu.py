"""verl 0.9.1's real v1 trainer, end to end on CPU: rollout, rewards, old log-probs, replay, advantage, update.

Each run is ``python -m mrtpo_verl.main_ppo`` in its own process (its own Ray cluster) with the CPU
backend of :mod:`mrtpo_cpu`: verl's own ``TaskRunnerV1``, ``ActorRolloutRefWorker``
with verl's FSDP2 engine on gloo, the ``hf`` rollout, verl's agent loop, reward loop and
TransferQueue, and our registered ``mrtpo_sync`` trainer. The model is the embedded
SmolLM2-135M-Instruct cut to its first two layers; the prompts are real IFEval prompts
("... without commas") scored by our instruction-following verifier; 4 prompts x 4 responses of
16 tokens per step.

Runs: ``mrtpo`` for 3 steps with the replay colocated in the actor's process (checkpoint at step 2
and 3), and a resume of that run from its step-2 checkpoint with the replay on a dedicated pool.
Together a few minutes on 2 cores. ``gdpo`` on this (sync) trainer runs in ``tests/test_learning_smoke_on_cpu.py``,
whose ``gdpo`` arm is the same trainer mode and CPU backend: one trainer run there serves both checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrtpo_cpu.launch import cpu_overrides, reward_overrides, run_main_ppo, save_derived_model

pytestmark = pytest.mark.slow

BATCH, N, RESPONSE_LENGTH, PROMPT_LENGTH, STEPS = 4, 4, 16, 128, 3
REWARD_KEYS = ("if_c0",)
INFO_KEYS = ("if_c0_info",)
WARMUP_STEPS = 4  # β_s differs at every step of the run
#: One trainer run's wall-clock limit (a run takes 1-3 minutes here); a hang fails instead of blocking CI.
RUN_TIMEOUT_S = 900


def ifeval_no_comma_rows(count: int) -> list[dict]:
    """Real IFEval prompts whose only constraint is "no commas", in verl's RL parquet layout."""
    from reward_fns.instruction_following.data import load_benchmark

    records = [r for r in load_benchmark("ifeval") if r["instruction_id_list"] == ["punctuation:no_comma"]]
    records = sorted(records, key=lambda r: len(r["prompt"]))[:count]
    rows = []
    for index, record in enumerate(records):
        kwargs = [{k: v for k, v in (e or {}).items() if v is not None} for e in record.get("kwargs") or []]
        truth = {"instruction_id_list": record["instruction_id_list"], "kwargs": kwargs, "prompt": record["prompt"]}
        rows.append(
            {
                "data_source": "ifeval",
                "prompt": [{"role": "user", "content": record["prompt"]}],
                "ability": "instruction_following",
                "reward_model": {"style": "rule", "ground_truth": json.dumps(truth)},
                "extra_info": {"split": "train", "index": index},
            }
        )
    return rows


def write_run_inputs(root: Path) -> Path:
    """The 2-layer model, 16 training rows and one batch of validation rows under ``root``; returns ``root``."""
    import pandas as pd

    save_derived_model(root / "model", num_layers=2)
    rows = ifeval_no_comma_rows(16)
    pd.DataFrame(rows).to_parquet(root / "train.parquet", index=False)
    pd.DataFrame(rows[:BATCH]).to_parquet(root / "val.parquet", index=False)
    return root


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run_inputs(tmp_path_factory.mktemp("cpu_run"))


def run_trainer(
    setup: Path,
    name: str,
    estimator: str,
    steps: int,
    extra: tuple[str, ...] = (),
    env_extra: dict | None = None,
    logical_gpus: int = 1,
) -> dict:
    """One ``mrtpo_verl.main_ppo`` run in a subprocess; returns its dir, return code, log and metrics by step."""
    out = setup / name
    overrides = cpu_overrides(
        model_path=setup / "model",
        train_files=setup / "train.parquet",
        val_files=setup / "val.parquet",
        ckpt_dir=out / "ckpt",
        prompt_length=PROMPT_LENGTH,
        response_length=RESPONSE_LENGTH,
        batch_size=BATCH,
        n=N,
        total_steps=steps,
        logical_gpus=logical_gpus,
        extra=(
            f"algorithm.adv_estimator={estimator}",
            *reward_overrides(["instruction_following"], REWARD_KEYS, INFO_KEYS),
            "+reward.custom_reward_function.reward_kwargs.max_constraints=1",
            f"mrtpo.warmup_steps={WARMUP_STEPS}",
            "trainer.logger=[console,file]",
            f"trainer.rollout_data_dir={out / 'rollouts'}",
            "data.seed=7",
            *extra,
        ),
    )
    return run_main_ppo(out, overrides, RUN_TIMEOUT_S, env_extra)


def require_success(run: dict) -> dict:
    assert run["returncode"] == 0, f"trainer run failed:\n{run['log'][-6000:]}"
    return run


@pytest.fixture(scope="module")
def mrtpo_run(setup_dir: Path) -> dict:
    return run_trainer(
        setup_dir,
        "mrtpo",
        "mrtpo",
        STEPS,
        extra=(
            "trainer.save_freq=2",
            "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        ),
    )


def rollout_prompts(run: dict, step: int) -> list[str]:
    lines = (run["dir"] / "rollouts" / f"{step}.jsonl").read_text().splitlines()
    return sorted(json.loads(line)["input"] for line in lines)


def test_mrtpo_runs_three_real_training_steps(mrtpo_run: dict, setup_dir: Path) -> None:
    run = require_success(mrtpo_run)
    assert sorted(run["metrics"]) == [1, 2, 3]
    for step, data in run["metrics"].items():
        # MRTPO's metrics, every step: the warm-up β_s, the replay stage and the per-reward weights.
        expected_beta = 0.5 * (3 * (step / WARMUP_STEPS) ** 2 - 2 * (step / WARMUP_STEPS) ** 3)
        assert data["mrtpo/beta"] == pytest.approx(expected_beta)
        # The replay ran colocated, in the actor's own process on its FSDP2 model: no weights to push.
        for key in (
            "mrtpo/replay/time_s",
            "mrtpo/replay/skip_fraction",
            "mrtpo/if_c0/weight_max",
            "mrtpo/replay/rank_time_s_max",
        ):
            assert key in data, f"step {step}: {key} not logged"
        assert "mrtpo/replay/weight_sync_s" not in data
        # Every stage of verl's step ran.
        for key in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor"):
            assert key in data, f"step {step}: {key} not logged"
    # Rewards varied inside some group, so some advantage and some gradient are not zero.
    assert any(data["actor/grad_norm"] > 0 for data in run["metrics"].values())
    assert any(data["mrtpo/replay/forward_passes"] > 0 for data in run["metrics"].values())


def test_actor_parameters_changed(mrtpo_run: dict, setup_dir: Path) -> None:
    import torch
    from safetensors.torch import load_file

    run = require_success(mrtpo_run)
    before = load_file(str(next((setup_dir / "model").glob("*.safetensors"))))
    saved = run["dir"] / "ckpt" / "global_step_3" / "actor" / "huggingface"
    after = {}
    for path in saved.glob("*.safetensors"):
        after.update(load_file(str(path)))
    assert after, f"no HF weights saved under {saved}"
    changed = [name for name, tensor in after.items() if name in before and not torch.equal(tensor, before[name])]
    assert changed, "no actor parameter changed after 3 updates"


def test_resume_from_step_2_continues_at_step_3(mrtpo_run: dict, setup_dir: Path) -> None:
    first = require_success(mrtpo_run)
    checkpoint = first["dir"] / "ckpt" / "global_step_2"
    assert (checkpoint / "data.pt").exists()
    resumed = require_success(
        run_trainer(
            setup_dir,
            "mrtpo_resumed",
            "mrtpo",
            STEPS,
            extra=(
                "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={checkpoint}",
                # The other placement: a dedicated replay pool that receives the actor's weights each step.
                "mrtpo.replay.placement=dedicated",
            ),
        )
    )
    assert sorted(resumed["metrics"]) == [3]
    assert resumed["metrics"][3]["mrtpo/replay/weight_sync_s"] > 0
    assert resumed["metrics"][3]["mrtpo/beta"] == first["metrics"][3]["mrtpo/beta"]
    assert rollout_prompts(resumed, 3) == rollout_prompts(first, 3)  # same data order

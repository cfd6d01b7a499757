"""``python -m benchmarks.learning --preset smoke``: the comparison harness end to end on verl's real trainer.

Two arms (``gdpo``, ``mrtpo``), one seed, two steps each on a 2-layer cut of SmolLM2 (the CPU backend
of ``mrtpo_cpu``, as in ``tests/cpu_run``), on the built demo task; evaluation before
training and after each step. The command runs as users run it (a subprocess); the test reads back
the per-step records, the report and its plots, runs the command again (nothing is rerun) and with
changed settings (refused, the field named). Checks that it runs and records what verl logged, not
that anything learns in two steps. About two to three minutes on 2 cores.

The pieces without a trainer (plan order, merging an interrupted run's attempts, intervals) are
tested on their own below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.learning.cli import interleaved_plan
from benchmarks.learning.records import eval_means, step_records
from benchmarks.learning.report import Comparison, moved_table, reward_table
from benchmarks.learning.runner import merged_metrics
from benchmarks.learning.stats import steps_to_threshold, t_interval
from benchmarks.learning.tasks import DEMO_TASKS, demo_records, demo_task

REPO = Path(__file__).resolve().parents[1]
KEYS = ("if_c0", "if_c1")
#: The whole smoke comparison's limit (two trainer runs); a hang fails instead of blocking CI.
COMMAND_TIMEOUT_S = 1200


def harness(out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "benchmarks.learning", "--preset", "smoke", "--out", str(out), *options]
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("learning") / "smoke"
    return out, harness(out)


def records_of(out: Path, arm: str) -> list[dict]:
    path = out / "runs" / arm / "seed0" / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_every_arm_trains_and_is_evaluated(smoke: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, result = smoke
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    for arm in ("gdpo", "mrtpo"):
        records = records_of(out, arm)
        assert [r["step"] for r in records] == [0, 1, 2]
        # Evaluation before training and after every step (test_freq 1), each reward in [0, 1].
        for record in records:
            assert set(record["eval"]) == set(KEYS)
            assert all(0.0 <= value <= 1.0 for value in record["eval"].values())
        for record in records[1:]:
            assert set(record["train"]) == set(KEYS)
            assert record["step_time_s"] > 0 and record["gen_s"] > 0 and record["update_actor_s"] > 0
            assert "entropy" in record and "kl_old" in record
        assert ("beta" in records[1]) == (arm == "mrtpo")
        # What verl itself logged: every training step of verl's sync trainer (the default mode, mrtpo_sync)
        # updated the actor, and only the mrtpo arm ran the replay stage. This is also the check that GDPO runs
        # on our sync trainer (tests/cpu_run runs only MRTPO on it).
        metrics_file = out / "runs" / arm / "seed0" / "attempt_0" / "metrics.jsonl"
        logged = [json.loads(line) for line in metrics_file.read_text().splitlines()]
        trained = {entry["step"]: entry["data"] for entry in logged if "timing_s/update_actor" in entry["data"]}
        assert sorted(trained) == [1, 2]
        assert all(any(k.startswith("mrtpo/replay/") for k in data) == (arm == "mrtpo") for data in trained.values())
    # Same seed, same data: step 0 (before any update) is evaluated on identical weights, greedily.
    gdpo, mrtpo = records_of(out, "gdpo"), records_of(out, "mrtpo")
    assert gdpo[0]["eval"] == mrtpo[0]["eval"]
    # Step 1 samples from the same initial weights; under full determinism the hf rollout seeds each request
    # by its index in the batch, so both arms sample the same responses whatever order requests arrive in:
    # the same lengths, rewards and the actor's entropy over them (a float that any changed token would move).
    for key in ("train", "response_length", "entropy"):
        assert gdpo[1][key] == mrtpo[1][key], key


@pytest.mark.slow
def test_report_has_tables_and_a_plot_per_reward(smoke: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, result = smoke
    assert result.returncode == 0, result.stderr[-3000:]
    report = (out / "report.md").read_text()
    assert "Finished runs: 2 of 2" in report
    for key in KEYS:
        plot = out / f"report_{key}.png"
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
        assert f"![{key}](report_{key}.png)" in report
    assert "| gdpo | 1 |" in report and "| mrtpo | 1 |" in report
    assert "eval mean over steps ≥ 1" in report
    assert "1.00x" in report  # gdpo's own step-time ratio


@pytest.mark.slow
def test_a_second_command_reruns_nothing_and_refuses_other_settings(
    smoke: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, first = smoke
    assert first.returncode == 0, first.stderr[-3000:]
    again = harness(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished before, kept") == 2
    assert not list(out.glob("runs/*/seed0/attempt_1"))
    other = harness(out, "--lr", "0.001")
    assert other.returncode != 0
    assert "lr: 1e-05 -> 0.001" in other.stderr


def test_plan_rotates_the_arm_order_per_seed() -> None:
    plan = interleaved_plan(["gdpo", "mrtpo", "mrtpo_shuffle"], [5, 6, 7])
    assert plan[:3] == [("gdpo", 5), ("mrtpo", 5), ("mrtpo_shuffle", 5)]
    assert plan[3:6] == [("mrtpo", 6), ("mrtpo_shuffle", 6), ("gdpo", 6)]
    assert plan[6:] == [("mrtpo_shuffle", 7), ("gdpo", 7), ("mrtpo", 7)]


def write_attempt(folder: Path, index: int, lines: list[dict], cut_last: bool = False) -> None:
    attempt = folder / f"attempt_{index}"
    attempt.mkdir(parents=True)
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (attempt / "metrics.jsonl").write_text(text[:-10] if cut_last else text)


def test_an_interrupted_run_is_merged_with_its_resumed_attempt(tmp_path: Path) -> None:
    # Attempt 0 logged steps 0-3 and was killed while writing step 4; a checkpoint at step 2; attempt 1
    # resumed from it: evaluation again at step 2, then steps 3-4.
    write_attempt(
        tmp_path,
        0,
        [
            {"step": 0, "data": {"val-aux/src/if_c0/mean@1": 0.1}},
            {"step": 1, "data": {"reward/if_c0/mean": 0.2}},
            {"step": 2, "data": {"reward/if_c0/mean": 0.3}},
            {"step": 3, "data": {"reward/if_c0/mean": 0.9}},
            {"step": 4, "data": {"reward/if_c0/mean": 0.9}},
        ],
        cut_last=True,
    )
    write_attempt(
        tmp_path,
        1,
        [
            {"step": 2, "data": {"val-aux/src/if_c0/mean@1": 0.25}},
            {"step": 3, "data": {"reward/if_c0/mean": 0.4}},
            {"step": 4, "data": {"reward/if_c0/mean": 0.5}},
        ],
    )
    merged = merged_metrics(tmp_path)
    assert sorted(merged) == [0, 1, 2, 3, 4]
    assert merged[2] == {"reward/if_c0/mean": 0.3, "val-aux/src/if_c0/mean@1": 0.25}
    assert merged[3]["reward/if_c0/mean"] == 0.4  # the resumed attempt's step wins
    records = step_records(merged, ["if_c0"], {"src": 4}, "gdpo", 0)
    assert [r.get("eval", {}).get("if_c0") for r in records] == [0.1, None, 0.25, None, None]


def test_evaluation_means_are_weighted_by_rows_per_source() -> None:
    data = {"val-aux/a/if_c0/mean@1": 1.0, "val-aux/b/if_c0/mean@1": 0.0, "val-core/a/reward/mean@1": 1.0}
    assert eval_means(data, ["if_c0"], {"a": 1, "b": 3}) == {"if_c0": 0.25}
    with pytest.raises(ValueError, match=r"data source\(s\) \['b'\]"):
        eval_means(data, ["if_c0"], {"a": 1})


def test_intervals_and_steps_to_threshold() -> None:
    interval = t_interval([1.0, 2.0, 3.0])
    # mean 2, s = 1, t_{0.975, 2} = 4.3027: half-width 4.3027 / sqrt(3)
    assert interval.mean == 2.0
    assert interval.high - interval.mean == pytest.approx(4.302652729911275 / 3**0.5)
    assert t_interval([0.5]).text() == "0.500 (1 seed)"
    assert steps_to_threshold([(0, 0.1), (3, 0.5), (6, 0.8)], 0.5) == 3
    assert steps_to_threshold([(0, 0.1), (3, 0.4)], 0.5) is None


def test_per_reward_fields_and_the_advantage_share_moved() -> None:
    data = {
        "reward/if_c0/mean": 0.5,
        "reward/if_c0/zero_variance_group_share": 0.25,
        "reward/if_c1/zero_variance_group_share": 1.0,
        "mrtpo/beta": 0.5,
        "mrtpo/if_c0/relevance_top10_share": 0.3,
        "mrtpo/if_c0/weight_max": 2.5,
    }
    (record,) = step_records({1: data}, KEYS, {"src": 4}, "mrtpo", 3)
    assert record["no_signal_groups"] == {"if_c0": 0.25, "if_c1": 1.0}
    assert record["relevance_top10"] == {"if_c0": 0.3} and record["weight_max"] == {"if_c0": 2.5}
    comparison = Comparison({("mrtpo", 3): [record]}, KEYS, ["mrtpo"])
    # beta 0.5 x (0.3 - 0.10) = 0.100; no relevance logged for if_c1
    assert "| mrtpo | 0.100 | — |" in moved_table(comparison, ["mrtpo"])


@pytest.mark.parametrize("name", sorted(DEMO_TASKS))
def test_a_demo_answer_that_follows_both_instructions_meets_both_rewards(name: str) -> None:
    from reward_fns.instruction_following.checkers import check_constraint

    closing = {"if_pair": "\n\nP.S. Ask me more.", "if_start_end": " Is there anything else I can help with?"}[name]
    (record,) = demo_records(["How many singers are there?"], demo_task(name).constraints)
    answers = {"both": "My answer is yes." + closing, "first only": "My answer is yes.", "neither": "Six."}
    met = {
        label: [
            check_constraint(cid, kwargs, record["prompt"], answer).followed
            for cid, kwargs in zip(record["instruction_id_list"], record["kwargs"], strict=True)
        ]
        for label, answer in answers.items()
    }
    assert met == {"both": [True, True], "first only": [True, False], "neither": [False, False]}
    with pytest.raises(ValueError, match="choose from"):
        demo_task("no_such_task")


def test_the_evaluation_mean_over_training_steps_leaves_out_step_0() -> None:
    def run(arm: str, values: list[float]) -> list[dict]:
        return [{"arm": arm, "seed": 1, "step": step, "eval": {"if_c0": v}} for step, v in enumerate(values)]

    comparison = Comparison(
        {("gdpo", 1): run("gdpo", [0.5, 0.0, 0.5]), ("mrtpo", 1): run("mrtpo", [0.5, 1.0, 1.0])},
        KEYS,
        ["gdpo", "mrtpo"],
    )
    assert comparison.mean_eval("gdpo", 1, "if_c0") == 0.25
    assert comparison.mean_eval("mrtpo", 1, "if_c0") == 1.0
    table = "\n".join(reward_table(comparison, "if_c0", {}))
    assert "| mrtpo | 1 | 1.000 (1 seed) | 0.500 (1 seed) | 1.000 (1 seed) | 0.750 (1 seed) |" in table


def test_a_seed_whose_gdpo_run_has_not_finished_is_left_out_of_the_pairs() -> None:
    runs = {("mrtpo", 3): [{"arm": "mrtpo", "seed": 3, "step": step, "eval": {"if_c0": 0.5}} for step in (0, 1)]}
    table = "\n".join(reward_table(Comparison(runs, KEYS, ["gdpo", "mrtpo"]), "if_c0", {}))
    assert "| mrtpo | 1 | 0.500 (1 seed) | n/a (no gdpo run with these seeds) |" in table

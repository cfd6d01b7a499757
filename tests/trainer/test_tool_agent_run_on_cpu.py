"""One MRTPO step of verl 0.9.1's real trainer through verl's tool agent loop, on CPU.

``python -m mrtpo_verl.main_ppo`` with the CPU backend of :mod:`mrtpo_cpu` (as
``tests/cpu_run/test_verl_trainer_on_cpu.py``): the ``hf`` rollout, verl's agent loop with
``default_agent_loop=tool_agent`` and ``multi_turn.enable=true``, the real tool of :mod:`tests.trainer.count_rows_tool`
declared in verl's tool config, verl's reward loop with our text-to-SQL verifier, TransferQueue and our
``mrtpo_sync`` trainer. The model is the full SmolLM2-135M-Instruct (a cut model does not follow the few-shot prompt
that makes it call the tool). 2 prompts x 2 responses, one step.

Not in ``make test`` (minutes of a whole trainer run beside the advantage-step tests of the same layout in
``test_multi_turn_advantage_step_on_cpu.py``): ``make e2e`` runs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, spider_questions
from tests.trainer.count_rows_tool import tool_config
from tests.trainer.test_multi_turn_advantage_step_on_cpu import FEW_SHOT, MAX_ASSISTANT_TURNS

pytestmark = [pytest.mark.slow, pytest.mark.end_to_end]

BATCH, N, PROMPT_LENGTH, RESPONSE_LENGTH = 2, 2, 256, 160
RUN_TIMEOUT_S = 1850
REPO = Path(__file__).resolve().parents[2]


def tool_agent_rows() -> list[dict]:
    """The Spider questions with the few-shot tool prompt, in verl's RL parquet layout."""
    rows = []
    for index, example in enumerate(spider_questions()):
        rows.append(
            {
                "data_source": "spider/dev",
                "prompt": [*FEW_SHOT, {"role": "user", "content": example["question"]}],
                "ability": "text_to_sql",
                "reward_model": {"style": "rule", "ground_truth": {"sql": example["query"], "db_id": example["db_id"]}},
                "extra_info": {"split": "train", "index": index},
            }
        )
    return rows


@pytest.fixture(scope="module")
def tool_agent_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from mrtpo_cpu.launch import cpu_overrides, reward_overrides, run_main_ppo, save_derived_model

    root = tmp_path_factory.mktemp("tool_agent_run")
    save_derived_model(root / "model", num_layers=None)
    pd.DataFrame(tool_agent_rows()).to_parquet(root / "train.parquet", index=False)
    pd.DataFrame(tool_agent_rows()).to_parquet(root / "val.parquet", index=False)
    tools = tool_config(root / "tools.yaml")
    out = root / "run"
    overrides = cpu_overrides(
        model_path=root / "model",
        train_files=root / "train.parquet",
        val_files=root / "val.parquet",
        ckpt_dir=out / "ckpt",
        prompt_length=PROMPT_LENGTH,
        response_length=RESPONSE_LENGTH,
        batch_size=BATCH,
        n=N,
        total_steps=1,
        extra=(
            "algorithm.adv_estimator=mrtpo",
            *reward_overrides(["text_to_sql"], REWARD_KEYS, INFO_KEYS),
            "mrtpo.warmup_steps=0",
            "mrtpo.replay.skip_zero_advantage=false",
            "trainer.logger=[console,file]",
            "actor_rollout_ref.rollout.temperature=0.3",  # near-greedy: the few-shot tool calls; MRTPO needs T > 0
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={MAX_ASSISTANT_TURNS}",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        ),
    )
    # The tool's module is imported by the agent loop worker (a Ray actor): the repository on its path.
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return run_main_ppo(out, overrides, RUN_TIMEOUT_S, {"PYTHONPATH": pythonpath})


def test_one_mrtpo_step_through_verls_tool_agent_loop(tool_agent_run: dict) -> None:
    run = tool_agent_run
    assert run["returncode"] == 0, f"trainer run failed:\n{run['log'][-6000:]}"
    (data,) = run["metrics"].values()
    # Multi-turn responses: verl counts user + assistant + tool turns; 1 + 3 assistant + 2 tool turns = 6 at most.
    assert data["num_turns/max"] > 2, {k: v for k, v in data.items() if k.startswith("num_turns")}
    assert data["mrtpo/replay/rows_context_mismatch"] == 0.0
    assert data["mrtpo/replay/forward_passes"] == BATCH * N * (1 + len(REWARD_KEYS))
    assert "timing_s/update_actor" in data

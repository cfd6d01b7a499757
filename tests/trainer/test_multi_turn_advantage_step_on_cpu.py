"""Multi-turn (tool agent) responses through the v1 trainers' advantage step, on a batch verl's own code produced.

The batch is made the way a run makes it, in this process: verl 0.9.1's ``AgentLoopWorkerTQ`` (its real
``__init__``, which loads the tool from verl's tool config, and its ``_run_agent_loop``, which runs verl's
``ToolAgentLoop`` and ends in the worker's ``_agent_loop_postprocess`` writing the rows to a real TransferQueue) with
this repo's ``hf`` rollout server (:class:`~mrtpo_cpu.rollout.HFLLMServer`) generating greedily with the
real SmolLM2-135M-Instruct, a real tool (:mod:`tests.trainer.count_rows_tool`: row counts of the Spider SQLite
database) answering each tool call, and verl's ``RewardLoopWorker`` (a Ray actor) scoring with our text-to-SQL
verifier. A few-shot prompt makes the model call the tool in verl's ``hermes`` format, so each response is laid out
generated | tool output | generated | tool output | generated (three assistant turns at most). Two questions, two
greedy responses each.

The step under test is each registered trainer's ``_compute_advantage`` (built by the trainer's real ``__init__``;
its worker groups are not started). The replay backend is the real in-process replay, recording what it was asked;
the relevance it returns is checked against a by-hand reference built from verl's stored rows (not from the
request): one plain forward pass per context, the Jensen–Shannon distance written out in float64.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import ray
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.experimental.agent_loop import get_trajectory_info
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

from mrtpo_cpu.launch import reward_overrides, save_derived_model
from mrtpo_cpu.rollout import HFLLMServer
from mrtpo_verl.batch_keys import NEEDED_KEY, RELEVANCE_KEY
from mrtpo_verl.replay.batch_relevance import replayed_response_columns
from mrtpo_verl.replay.contexts import ReplayContextBuilder
from mrtpo_verl.startup import validate_run_config
from mrtpo_verl.trainer import advantage_step
from mrtpo_verl.trainer.advantage_step import CONTEXT_MISMATCH_METRIC
from mrtpo_verl.trainer.mrtpo_trainer import TRAINER_CLASSES
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, smollm2, spider_questions
from tests.support.trainer_overrides import SEPARATE_ASYNC_RULES
from tests.support.verl_layout import by_hand_relevance
from tests.trainer.count_rows_tool import TOOL_NAME, tool_config

pytestmark = pytest.mark.slow

MODES = sorted(TRAINER_CLASSES)
PROMPT_LENGTH, RESPONSE_LENGTH, MAX_ASSISTANT_TURNS = 512, 256, 3
GLOBAL_STEP = 5
N = 2  # responses per prompt (verl's sessions 0..N-1 of each uid)
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}


def tool_call(table: str) -> str:
    return f'<tool_call>{{"name": "{TOOL_NAME}", "arguments": {{"table": "{table}"}}}}</tool_call>'


#: Two worked examples before the question: SmolLM2-135M then calls the tool in hermes format on its own.
FEW_SHOT = [
    {"role": "system", "content": f"Answer by calling {TOOL_NAME}."},
    {"role": "user", "content": "How many stadiums are there?"},
    {"role": "assistant", "content": tool_call("stadium")},
    {"role": "user", "content": "How many concerts are there?"},
    {"role": "assistant", "content": tool_call("concert")},
]


def run_config(estimator: str, mode: str, model_dir: Path, tools: Path) -> Any:
    overrides = [
        f"trainer.v1.trainer_mode={mode}",
        f"algorithm.adv_estimator={estimator}",
        *reward_overrides(["text_to_sql"], REWARD_KEYS, INFO_KEYS),
        "mrtpo.warmup_steps=0",
        "mrtpo.replay.micro_batch_size=4",
        # The verifier gives both answers the same scores: replay every pair anyway (nothing skipped).
        "mrtpo.replay.skip_zero_advantage=false",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
        f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
        f"data.max_prompt_length={PROMPT_LENGTH}",
        f"data.max_response_length={RESPONSE_LENGTH}",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={MAX_ASSISTANT_TURNS}",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        *SEPARATE_ASYNC_RULES,
    ]
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(model folder, tool config): the full SmolLM2-135M-Instruct as an HF folder, and the tool's config file."""
    root = tmp_path_factory.mktemp("multi_turn_step")
    return save_derived_model(root / "model", num_layers=None), tool_config(root / "tools.yaml")


@pytest.fixture(scope="module")
def transfer_queue(run_inputs: tuple[Path, Path]) -> Any:
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = OmegaConf.to_container(run_config("mrtpo", "mrtpo_sync", *run_inputs).transfer_queue, resolve=True)
    config.update(enable=True)
    config["backend"]["SimpleStorage"].update(num_data_storage_units=1, total_storage_size=1000)
    try:
        tq.init(OmegaConf.create(config))
        try:
            yield
        finally:
            tq.close()
    finally:
        ray.shutdown()


def prompt_rows() -> list[dict[str, Any]]:
    """Two real Spider questions as verl's dataset hands them to the agent loop (one uid each, N sessions)."""
    rows = []
    for index, example in enumerate(spider_questions()):
        rows.append(
            {
                "raw_prompt": [*FEW_SHOT, {"role": "user", "content": example["question"]}],
                "uid": f"question{index}",
                "data_source": "spider/dev",
                "reward_model": {"style": "rule", "ground_truth": {"sql": example["query"], "db_id": example["db_id"]}},
                "extra_info": {"index": index},
                "index": index,
                "tools_kwargs": {},
                "global_steps": GLOBAL_STEP - 1,
            }
        )
    return rows


@pytest.fixture(scope="module")
def rollout(transfer_queue: Any, run_inputs: tuple[Path, Path]) -> dict[str, Any]:
    """verl's agent loop worker runs the tool agent loop on each prompt and stores the rows in TransferQueue.

    Returns the stored rows (every field, as ``kv_batch_get`` reads them back), their keys and the tags verl wrote.
    """
    model_dir, tools = run_inputs
    config = run_config("mrtpo", "mrtpo_sync", model_dir, tools)
    server = HFLLMServer(str(model_dir), PROMPT_LENGTH, RESPONSE_LENGTH)
    reward = ray.remote(RewardLoopWorker).options(num_cpus=0).remote(config)
    # The worker class behind verl's @ray.remote, built in this process so that it can call the local server.
    worker = AgentLoopWorkerTQ.__ray_metadata__.modified_class(
        config, llm_client=server, reward_loop_worker_handles=[reward]
    )

    async def run_all() -> None:
        rows = prompt_rows()
        trajectories = await get_trajectory_info(GLOBAL_STEP - 1, [row["index"] for row in rows], False)
        for row, trajectory in zip(rows, trajectories, strict=True):
            for session in range(N):
                await worker._run_agent_loop(
                    dict(GREEDY), trajectory, agent_name="tool_agent", session_id=session, **row
                )

    asyncio.run(run_all())
    ray.kill(reward)
    stored = tq.kv_list(partition_id="train")["train"]
    keys = sorted(key for key in stored if key.count("_") >= 2)
    return {
        "keys": keys,
        "tags": [stored[key] for key in keys],
        "fields": tq.kv_batch_get(keys=keys, partition_id="train"),
    }


def put_rollout(rollout: dict[str, Any], partition: str) -> Any:
    """verl's stored rows, fields and tags unchanged, in a partition of their own; → KVBatchMeta."""
    fields = copy.deepcopy(rollout["fields"])
    return tq.kv_batch_put(keys=rollout["keys"], partition_id=partition, fields=fields, tags=rollout["tags"])


def stored_rows(rollout: dict[str, Any]) -> list[dict[str, Any]]:
    """Per row, the prompt, response and response mask as verl stored them (unpadded token lists)."""
    fields = rollout["fields"]
    rows = []
    for row in range(len(rollout["keys"])):
        rows.append({name: fields[name][row].tolist() for name in ("prompts", "responses", "response_mask")})
        extra = fields["extra_fields"][row]
        rows[-1]["info"] = [getattr(extra, "data", extra)["reward_extra_info"][key] for key in INFO_KEYS]
    return rows


class RecordingReplay:
    """The real in-process replay, recording each (request, answer); an identical request is scored once."""

    name = "in-process (recording)"
    answers: ClassVar[dict[str, Any]] = {}

    def __init__(self, cfg: Any) -> None:
        model, tokenizer = smollm2()
        self.inner = InProcessBackend(cfg, model, tokenizer)
        self.calls: list[tuple[Any, Any]] = []

    def compute_relevance(self, request: Any) -> Any:
        digest = hashlib.sha256()
        for key in ("prompts", "attention_mask", "responses", "response_mask", NEEDED_KEY):
            digest.update(request.batch[key].numpy().tobytes())
        key = digest.hexdigest()
        if key not in self.answers:
            self.answers[key] = self.inner.compute_relevance(request)
        answer = copy.deepcopy(self.answers[key])
        self.calls.append((request, answer))
        return answer


def trainer_with_replay(mode: str, estimator: str, run_inputs: tuple[Path, Path]) -> tuple[Any, RecordingReplay]:
    trainer = get_trainer_cls(mode)(run_config(estimator, mode, *run_inputs))
    trainer.global_steps = GLOBAL_STEP
    cfg = validate_run_config(trainer.config)
    replay = RecordingReplay(cfg)
    trainer.attach_mrtpo(replay_stage=ReplayStage(cfg, trainer.config.algorithm, replay))
    return trainer, replay


def test_verls_tool_agent_loop_stored_tool_outputs_between_the_turns(rollout: dict[str, Any]) -> None:
    """The batch is what the test needs: every response is gen | tool | gen | tool | gen, the tool really ran."""
    _, tokenizer = smollm2()
    rows = stored_rows(rollout)
    assert len(rows) == N * len(spider_questions())
    for row, tags in zip(rows, rollout["tags"], strict=True):
        assert len(row["responses"]) == len(row["response_mask"]) == tags["response_len"]
        runs = [value for i, value in enumerate(row["response_mask"]) if i == 0 or value != row["response_mask"][i - 1]]
        assert runs == [1, 0, 1, 0, 1], runs
        tool_text = tokenizer.decode([t for t, m in zip(row["responses"], row["response_mask"], strict=True) if not m])
        # The database's answer to a count_rows call: a row count, or the tables it has.
        assert '"rows": ' in tool_text or '"tables": [' in tool_text, tool_text
        assert "<tool_call>" in tokenizer.decode(row["responses"])


@pytest.fixture(scope="module")
def reference_relevance(rollout: dict[str, Any], run_inputs: tuple[Path, Path]) -> list[torch.Tensor]:
    """Per row, (K, T) by-hand relevance over the whole stored response, contexts built from verl's stored rows."""
    model, tokenizer = smollm2()
    cfg = validate_run_config(run_config("mrtpo", "mrtpo_sync", *run_inputs))
    builder = ReplayContextBuilder.from_config(tokenizer, cfg.reward_keys, cfg.replay)
    references = []
    for row in stored_rows(rollout):
        contexts = builder.build(row["prompts"], row["responses"], row["info"])
        references.append(by_hand_relevance(model, contexts, row["responses"]))
    return references


@pytest.mark.parametrize("mode", MODES)
def test_the_replay_sees_each_response_as_the_policy_saw_it(
    rollout: dict[str, Any], reference_relevance: list[torch.Tensor], run_inputs: tuple[Path, Path], mode: str
) -> None:
    meta = put_rollout(rollout, f"multi-turn-mrtpo-{mode}")
    trainer, replay = trainer_with_replay(mode, "mrtpo", run_inputs)
    metrics: dict = {}
    trainer._compute_advantage(meta, metrics)

    ((request, answer),) = replay.calls
    columns = replayed_response_columns(request)
    relevance = answer.batch[RELEVANCE_KEY]
    for row, stored in enumerate(stored_rows(rollout)):
        # Every response token the rollout produced is replayed, tool outputs included, in order.
        assert columns[row].tolist() == list(range(len(stored["responses"])))
        assert request.batch["responses"][row][columns[row]].tolist() == stored["responses"]
        prompt_mask = request.batch["attention_mask"][row, : request.batch["prompts"].shape[1]].bool()
        assert request.batch["prompts"][row][prompt_mask].tolist() == stored["prompts"]
        # Relevance at the generated positions is the by-hand one; 0 on the tool outputs and the padding.
        generated = torch.zeros(relevance.shape[-1], dtype=torch.bool)
        generated[: len(stored["response_mask"])] = torch.tensor(stored["response_mask"], dtype=torch.bool)
        expected = torch.zeros(len(REWARD_KEYS), relevance.shape[-1], dtype=torch.float64)
        expected[:, : len(stored["responses"])] = reference_relevance[row]
        expected *= generated
        torch.testing.assert_close(relevance[row].double(), expected, atol=2e-5, rtol=0)
        assert relevance[row][:, generated].gt(0).all()
        assert not relevance[row][:, ~generated].any()
    assert metrics[CONTEXT_MISMATCH_METRIC] == 0.0
    assert metrics["mrtpo/replay/forward_passes"] == len(stored_rows(rollout)) * (1 + len(REWARD_KEYS))


@pytest.mark.parametrize("mode", MODES)
def test_gdpo_reads_verls_length_based_layout(
    rollout: dict[str, Any], run_inputs: tuple[Path, Path], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's gdpo puts each reward at ``attention_mask[:, P:].sum() - 1``: the response's last stored token."""
    seen: list[dict[str, torch.Tensor]] = []
    verl_gdpo = core_algos.ADV_ESTIMATOR_REGISTRY["gdpo"]

    def recording_gdpo(**kwargs: Any) -> Any:
        seen.append({key: kwargs["batch"][key].clone() for key in ("prompts", "attention_mask")})
        return verl_gdpo(**kwargs)

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "gdpo", recording_gdpo)
    meta = put_rollout(rollout, f"multi-turn-gdpo-{mode}")
    trainer = get_trainer_cls(mode)(run_config("gdpo", mode, *run_inputs))
    trainer.global_steps = GLOBAL_STEP
    trainer._compute_advantage(meta, {})

    (batch,) = seen
    prompt_width = batch["prompts"].shape[1]
    valid_response_length = batch["attention_mask"][:, prompt_width:].sum(dim=1) - 1
    stored = stored_rows(rollout)
    assert valid_response_length.tolist() == [len(row["responses"]) - 1 for row in stored]
    assert batch["attention_mask"][:, :prompt_width].sum(dim=1).tolist() == [len(row["prompts"]) for row in stored]
    got = tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id, select_fields=["advantages"])
    assert np.isfinite(got["advantages"].to_padded_tensor(0.0).numpy()).all()


def response_mask_layout(data: Any, prompt_lengths: torch.Tensor, response_lengths: torch.Tensor) -> None:
    """A deliberately bad mask: the response half from ``response_mask`` (drops the tool outputs)."""
    prompts = data.batch["prompts"]
    positions = torch.arange(prompts.shape[1])
    prompt_mask = (positions[None, :] < prompt_lengths[:, None]).long()
    data.batch["attention_mask"] = torch.cat([prompt_mask, data.batch["response_mask"].long()], dim=1)


def test_a_replay_that_would_drop_tokens_is_counted_and_named_once(
    rollout: dict[str, Any], run_inputs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    monkeypatch.setattr(advantage_step, "_add_full_attention_mask", response_mask_layout)
    trainer, _ = trainer_with_replay("mrtpo_sync", "mrtpo", run_inputs)
    with caplog.at_level(logging.WARNING, logger=advantage_step.__name__):
        for step in (1, 2):
            metrics: dict = {}
            trainer._compute_advantage(put_rollout(rollout, f"multi-turn-bad-mask-{step}"), metrics)
            assert metrics[CONTEXT_MISMATCH_METRIC] == len(rollout["keys"])  # every row, every step
    warnings = [record for record in caplog.records if CONTEXT_MISMATCH_METRIC in record.getMessage()]
    assert len(warnings) == 1
    stored = stored_rows(rollout)
    generated = sum(stored[0]["response_mask"])
    assert (
        f"row 0: {generated} response tokens replayed, {len(stored[0]['responses'])} stored" in warnings[0].getMessage()
    )

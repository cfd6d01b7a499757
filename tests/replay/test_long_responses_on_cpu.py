"""Responses at ``data.max_response_length`` on the real SmolLM2-135M-Instruct: the replay budget and its row rule.

Two Spider prompts, each with a response of exactly ``data.max_response_length`` tokens (the model's own greedy
continuation, forced to that length) and a short one, through the replay stage with an in-process backend:

- with the start-up budget (verl's prompt + response lengths + the verifier allowance) every row is replayed in
  full, up to its last response position;
- with the tightest budget start-up accepts (prompt + response lengths exactly), a full-length response leaves no
  room for even the verifier block's header: those rows alone get zero relevance (uniform token weights), counted
  in ``mrtpo/replay/rows_unscored`` with a warning, and the other rows (verifier texts cut to fit) get exactly the
  relevance they get without them.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto

from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.math.token_weights import token_weights
from mrtpo_verl.startup.lengths import resolve_replay_settings
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.verl_layout import verl_rollout_tensors

from .conftest import REWARD_KEYS, SpiderPrompt

pytestmark = pytest.mark.slow

MAX_RESPONSE_LENGTH = 96
INFO_KEYS = tuple(f"{key}_info" for key in REWARD_KEYS)


def rollout_prompt_ids(tokenizer: Any, prompt: SpiderPrompt) -> list[int]:
    return list(
        tokenizer.apply_chat_template(prompt.messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    )


@pytest.fixture(scope="module")
def long_batch(
    smollm2: tuple[Any, Any], spider_prompts: list[SpiderPrompt], generated_responses: list[list[int]]
) -> tuple[DataProto, int]:
    """(batch, data.max_prompt_length): per prompt a response of exactly MAX_RESPONSE_LENGTH tokens and a short one."""
    model, tokenizer = smollm2
    prompts, responses = [], []
    for prompt, short in zip(spider_prompts, generated_responses, strict=True):
        ids = rollout_prompt_ids(tokenizer, prompt)
        with torch.inference_mode():
            full = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                min_new_tokens=MAX_RESPONSE_LENGTH,
                max_new_tokens=MAX_RESPONSE_LENGTH,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(ids) :].tolist()
        assert len(full) == MAX_RESPONSE_LENGTH
        prompts += [ids, ids]
        responses += [full, short]
    max_prompt_length = max(len(ids) for ids in prompts)
    tensors = verl_rollout_tensors(
        prompts, responses, [[1] * len(r) for r in responses], max_prompt_length, MAX_RESPONSE_LENGTH, 0
    )
    rows = len(prompts)
    non_tensors: dict[str, np.ndarray] = {"uid": np.array([f"p{row // 2}" for row in range(rows)], dtype=object)}
    for k, (key, info_key) in enumerate(zip(REWARD_KEYS, INFO_KEYS, strict=True)):
        non_tensors[key] = np.array([float((row + k) % 2) for row in range(rows)])
        non_tensors[info_key] = np.array(
            [spider_prompts[row // 2].verifier_info[k] for row in range(rows)], dtype=object
        )
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors), max_prompt_length


def mrtpo_config(max_prompt_length: int, **replay: Any) -> MRTPOConfig:
    """The ``mrtpo`` block as start-up resolves it for these data lengths (no model path: no position check)."""
    cfg = MRTPOConfig(
        reward_keys=REWARD_KEYS,
        verifier_info_keys=INFO_KEYS,
        replay=ReplayConfig(micro_batch_size=4, skip_zero_advantage=False, **replay),
    )
    run = OmegaConf.create(
        {"data": {"max_prompt_length": max_prompt_length, "max_response_length": MAX_RESPONSE_LENGTH}}
    )
    return resolve_replay_settings(run, cfg)


def run_stage(smollm2: tuple[Any, Any], cfg: MRTPOConfig, data: DataProto) -> tuple[torch.Tensor, dict[str, float]]:
    model, tokenizer = smollm2
    return ReplayStage(cfg, None, InProcessBackend(cfg, model, tokenizer)).run(data, global_step=5)


def test_auto_budget_replays_full_length_responses_in_full(
    smollm2: tuple[Any, Any], long_batch: tuple[DataProto, int]
) -> None:
    data, max_prompt_length = long_batch
    cfg = mrtpo_config(max_prompt_length)
    assert cfg.replay.max_context_tokens == max_prompt_length + MAX_RESPONSE_LENGTH + cfg.replay.verifier_block_tokens
    relevance, metrics = run_stage(smollm2, cfg, data)
    assert metrics["mrtpo/replay/rows_unscored"] == 0 and metrics["mrtpo/replay/truncated_contexts"] == 0
    assert metrics["mrtpo/replay/forward_passes"] == len(data) * (1 + len(REWARD_KEYS))
    full_rows = data.batch["response_mask"].sum(dim=1) == MAX_RESPONSE_LENGTH
    assert int(full_rows.sum()) == 2
    # Relevance reaches the last response position of a full-length response.
    assert relevance[full_rows][:, :, -8:].gt(0).any(dim=-1).all()


def test_a_row_over_the_tightest_budget_alone_gets_uniform_weights(
    smollm2: tuple[Any, Any], long_batch: tuple[DataProto, int], caplog: pytest.LogCaptureFixture
) -> None:
    data, max_prompt_length = long_batch
    tight = max_prompt_length + MAX_RESPONSE_LENGTH  # the smallest explicit budget start-up accepts
    cfg = mrtpo_config(max_prompt_length, max_context_tokens=tight)
    prompt_lengths = data.batch["attention_mask"][:, :max_prompt_length].sum(dim=1)
    response_lengths = data.batch["response_mask"].sum(dim=1)
    room = tight - prompt_lengths - response_lengths  # tokens left for the verifier block
    header_alone = len(smollm2[1]("\n\n" + cfg.replay.verifier_header, add_special_tokens=False)["input_ids"])
    over = (room < header_alone).nonzero().flatten().tolist()  # not even the block's header fits
    assert over == (response_lengths == MAX_RESPONSE_LENGTH).nonzero().flatten().tolist() and len(over) == 2
    assert bool((room[over] >= 0).all())  # ... though prompt + response alone fit: only the block is missing

    with caplog.at_level(logging.WARNING):
        relevance, metrics = run_stage(smollm2, cfg, data)

    assert metrics["mrtpo/replay/rows_unscored"] == len(over)
    assert metrics["mrtpo/replay/truncated_contexts"] > 0  # the other rows fit by cutting their verifier texts
    assert not relevance[over].any()
    weights = token_weights(relevance, data.batch["response_mask"], beta=1.0)
    assert torch.equal(weights[over], torch.ones_like(weights[over]))
    for row in over:  # the worker's reason, per row
        assert f"row {row} ({int(prompt_lengths[row])} prompt + {MAX_RESPONSE_LENGTH} response tokens)" in caplog.text
    assert f"{len(over)} response(s) did not fit mrtpo.replay.max_context_tokens={tight}" in caplog.text

    others = [row for row in range(len(data)) if row not in over]
    assert relevance[others].gt(0).any(dim=-1).all()
    alone, alone_metrics = run_stage(smollm2, cfg, data.select_idxs(others))
    assert alone_metrics["mrtpo/replay/rows_unscored"] == 0
    torch.testing.assert_close(relevance[others], alone, atol=1e-5, rtol=0)

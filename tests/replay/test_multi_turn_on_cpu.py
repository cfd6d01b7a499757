"""Multi-turn (tool agent) responses and chat-template options, replayed as verl's rollout produced them.

The trajectory is built the way verl 0.9.1's ``ToolAgentLoop`` builds one, with verl's own Continuous Token
builder: the prompt rendered with ``data.apply_chat_template_kwargs`` (here ``enable_thinking: false`` on a
Qwen3-style ChatML template given to SmolLM2's tokenizer), then three assistant turns generated greedily by the
real SmolLM2-135M-Instruct (mask 1) with two tool outputs merged between them (mask 0), padded into verl's
agent-loop layout. The replay must feed every attention-mask-valid response token, tool outputs included, and
put each position's relevance in its own column; it is checked against a by-hand reference: one plain forward
pass of the model per context over ``context + whole response``, and the Jensen–Shannon distance written out
from its definition in float64.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

from mrtpo_verl.batch_keys import NEEDED_KEY, RELEVANCE_KEY
from mrtpo_verl.replay.batch_relevance import relevance_for_request
from mrtpo_verl.replay.contexts import ReplayContextBuilder
from mrtpo_verl.replay.scorer import ReplayScorer
from tests.support.verl_layout import by_hand_relevance, verl_rollout_tensors

from .conftest import REWARD_KEYS, SpiderPrompt

pytestmark = pytest.mark.slow

INFO_KEYS = tuple(f"{key}_info" for key in REWARD_KEYS)
THINKING_OFF = {"enable_thinking": False}
#: ChatML with a Qwen3-style switch: enable_thinking=false closes an empty think block in the generation prompt.
QWEN3_STYLE_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
TOOL_OUTPUTS = ('{"rows": [[6]], "columns": ["count"]}', '{"error": "no such column: Age"}')
TOKENS_PER_TURN = 6
PROMPT_WIDTH, RESPONSE_WIDTH = 160, 96


@pytest.fixture(scope="module")
def thinking_tokenizer(smollm2: tuple[Any, Any]) -> Any:
    tokenizer = copy.deepcopy(smollm2[1])
    tokenizer.chat_template = QWEN3_STYLE_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def verl_builder(thinking_tokenizer: Any) -> Any:
    """verl's own Continuous Token builder, as the agent loop creates it."""
    return create_continuous_token_builder(
        thinking_tokenizer, hf_model_type="llama", chat_template_kwargs=dict(THINKING_OFF)
    )


def generate(model: Any, ids: list[int], tokenizer: Any) -> list[int]:
    """A greedy assistant turn that stops as the rollout's stop token would: at most N tokens, then <|im_end|>."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=TOKENS_PER_TURN,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )[0, len(ids) :].tolist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return out[: out.index(end) + 1] if end in out else [*out, end]


def tool_agent_trajectory(
    model: Any, tokenizer: Any, verl_builder: Any, messages: list[dict[str, str]], turns: int
) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, response mask) as ``ToolAgentLoop`` assembles them, ``turns`` assistant turns."""
    messages = [dict(m) for m in messages]
    prompt_ids = verl_builder.build_initial_tokens(messages)
    runtime, mask = list(prompt_ids), []
    for turn in range(turns):
        assistant = generate(model, runtime, tokenizer)
        merged = verl_builder.merge_assistant_tokens(runtime, assistant)
        mask, _ = verl_builder.align_response_metadata(merged, mask)
        runtime = merged.token_ids
        if turn == turns - 1:
            break
        previous = [*messages, {"role": "assistant", "content": tokenizer.decode(assistant, skip_special_tokens=True)}]
        messages = [*previous, {"role": "tool", "content": TOOL_OUTPUTS[turn % len(TOOL_OUTPUTS)]}]
        merged = verl_builder.merge_context_tokens(previous, messages, runtime)
        mask, _ = verl_builder.align_response_metadata(merged, mask)
        runtime = merged.token_ids
    return list(prompt_ids), runtime[len(prompt_ids) :], mask


@pytest.fixture(scope="module")
def agent_batch(
    smollm2: tuple[Any, Any], thinking_tokenizer: Any, verl_builder: Any, spider_prompts: list[SpiderPrompt]
) -> DataProto:
    """Two rows of one group: three assistant turns with two tool outputs between them, and one single turn."""
    model, _ = smollm2
    prompt = spider_prompts[0]
    rows = [tool_agent_trajectory(model, thinking_tokenizer, verl_builder, prompt.messages, turns) for turns in (3, 1)]
    tensors = verl_rollout_tensors(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], PROMPT_WIDTH, RESPONSE_WIDTH, 0
    )
    tensors[NEEDED_KEY] = torch.ones(len(rows), len(REWARD_KEYS), dtype=torch.bool)
    infos = {
        key: np.array([info] * len(rows), dtype=object)
        for key, info in zip(INFO_KEYS, prompt.verifier_info, strict=True)
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=infos)


def replay_builder(tokenizer: Any, **kwargs: Any) -> ReplayContextBuilder:
    return ReplayContextBuilder(tokenizer, REWARD_KEYS, **kwargs)


def test_the_batch_has_verls_agent_loop_layout(agent_batch: DataProto) -> None:
    mask = agent_batch.batch["response_mask"][0]
    valid = agent_batch.batch["attention_mask"][0, PROMPT_WIDTH:]
    assert int(valid.sum()) > int(mask.sum())  # tool outputs: attended, not generated
    # generated | tool | generated | tool | generated | padding
    runs = torch.unique_consecutive(mask[valid.bool()]).tolist()
    assert runs == [1, 0, 1, 0, 1]
    assert not mask[~valid.bool()].any()


def test_replayed_prompt_tokens_are_the_rollouts(
    thinking_tokenizer: Any, verl_builder: Any, spider_prompts: list[SpiderPrompt]
) -> None:
    messages = spider_prompts[0].messages
    rollout_ids = tuple(verl_builder.build_initial_tokens([dict(m) for m in messages]))
    assert thinking_tokenizer.decode(list(rollout_ids)).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    builder = replay_builder(thinking_tokenizer, chat_template_kwargs=THINKING_OFF)
    without_info = builder.build(rollout_ids, [2], [None, None, None])
    assert without_info.full_context_ids == rollout_ids
    with_info = builder.build(rollout_ids, [2], spider_prompts[0].verifier_info)
    tail = len(tuple(thinking_tokenizer("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")["input_ids"]))
    for context in (with_info.full_context_ids, *with_info.leave_one_out_ids):
        assert context[: len(rollout_ids) - tail] == rollout_ids[:-tail]  # the rollout's prompt, token for token
        assert context[-tail:] == rollout_ids[-tail:]
    text = thinking_tokenizer.decode(list(with_info.full_context_ids))
    assert text.index("Verifier information") < text.rindex("<|im_end|>\n<|im_start|>assistant\n<think>")
    # The chat-message path renders with the same kwargs and gives the same tokens.
    assert builder.build(messages, [2], spider_prompts[0].verifier_info) == with_info


def test_prompt_rendered_with_other_template_options_is_refused(
    thinking_tokenizer: Any, verl_builder: Any, spider_prompts: list[SpiderPrompt]
) -> None:
    rollout_ids = verl_builder.build_initial_tokens([dict(m) for m in spider_prompts[0].messages])
    with pytest.raises(ValueError, match=r"chat_template_kwargs=\{\}.*data\.apply_chat_template_kwargs"):
        replay_builder(thinking_tokenizer).build(rollout_ids, [2], spider_prompts[0].verifier_info)


@pytest.mark.parametrize("share_prefix", [True, False])
def test_relevance_of_every_position_lands_in_its_own_column(
    smollm2: tuple[Any, Any], thinking_tokenizer: Any, agent_batch: DataProto, share_prefix: bool
) -> None:
    model, _ = smollm2
    builder = replay_builder(thinking_tokenizer, chat_template_kwargs=THINKING_OFF)
    scorer = ReplayScorer(model, micro_batch_size=4, share_prefix=share_prefix)
    answer = relevance_for_request(agent_batch, builder, scorer, INFO_KEYS)
    relevance = answer.batch[RELEVANCE_KEY]
    assert relevance.shape == (2, len(REWARD_KEYS), RESPONSE_WIDTH)
    assert float(answer.batch["mrtpo_tokens_replayed"].sum()) > 0

    for row in range(2):
        valid = agent_batch.batch["attention_mask"][row, PROMPT_WIDTH:].bool()
        generated = agent_batch.batch["response_mask"][row].bool()
        prompt = agent_batch.batch["prompts"][row][agent_batch.batch["attention_mask"][row, :PROMPT_WIDTH].bool()]
        response = agent_batch.batch["responses"][row][valid].tolist()  # tool outputs included
        contexts = builder.build(prompt.tolist(), response, [agent_batch.non_tensor_batch[k][row] for k in INFO_KEYS])
        expected = torch.zeros(len(REWARD_KEYS), RESPONSE_WIDTH, dtype=torch.float64)
        expected[:, : len(response)] = by_hand_relevance(model, contexts, response)
        expected *= generated  # tool outputs and padding carry no weight
        torch.testing.assert_close(relevance[row].double(), expected, atol=2e-5, rtol=0)
        assert relevance[row][:, generated].gt(0).all()
        assert not relevance[row][:, ~generated].any()


@pytest.fixture(scope="module")
def smollm2_float64(smollm2: tuple[Any, Any]) -> Any:
    """SmolLM2 in float64: two sequences of different length then give the shared first turn's relevance to
    ~1e-12, where float32's shape-dependent summation order alone moves it by up to ~1e-5 (relevance is a square
    root, so float32's rounding of a near-zero divergence is magnified)."""
    return copy.deepcopy(smollm2[0]).double()


def test_dropping_the_tool_outputs_would_change_the_later_turns(
    smollm2_float64: Any, thinking_tokenizer: Any, agent_batch: DataProto
) -> None:
    """The check above can fail: replaying only the generated tokens gives other relevance after a tool output.

    Both replays run in float64, so "identical up to the first tool output" is checked tightly (1e-6) whatever
    the two sequences' padded shapes make float32 do."""
    model = smollm2_float64
    builder = replay_builder(thinking_tokenizer, chat_template_kwargs=THINKING_OFF)
    valid = agent_batch.batch["attention_mask"][0, PROMPT_WIDTH:].bool()
    generated = agent_batch.batch["response_mask"][0].bool()
    prompt = agent_batch.batch["prompts"][0][agent_batch.batch["attention_mask"][0, :PROMPT_WIDTH].bool()].tolist()
    infos = [agent_batch.non_tensor_batch[k][0] for k in INFO_KEYS]
    with_tools = agent_batch.batch["responses"][0][valid].tolist()
    without_tools = agent_batch.batch["responses"][0][generated].tolist()
    seen = by_hand_relevance(model, builder.build(prompt, with_tools, infos), with_tools)[:, generated[valid]]
    dropped = by_hand_relevance(model, builder.build(prompt, without_tools, infos), without_tools)
    first_turn = TOKENS_PER_TURN  # identical up to the first tool output, different after it
    assert torch.allclose(seen[:, :first_turn], dropped[:, :first_turn], atol=1e-6)
    assert (seen[:, first_turn:] - dropped[:, first_turn:]).abs().max() > 1e-2

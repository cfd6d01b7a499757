"""Replay contexts with SmolLM2's real tokenizer and chat template: structure, empty info, errors, truncation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrtpo_verl.config import ReplayConfig
from mrtpo_verl.replay.contexts import (
    TRUNCATION_MARKER,
    ReplayContextBuilder,
    ReplayContexts,
    count_truncated_verifiers,
)

from .conftest import REWARD_KEYS, SpiderPrompt

pytestmark = pytest.mark.slow
HEADER = ReplayConfig.verifier_header


def decoded(tokenizer: Any, ids: tuple[int, ...]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


def last_user_turn(text: str) -> str:
    """Content of the last ChatML user turn (SmolLM2's template)."""
    return text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture
def tokenizer(smollm2: tuple[Any, Any]) -> Any:
    return smollm2[1]


@pytest.fixture
def builder(tokenizer: Any) -> ReplayContextBuilder:
    return ReplayContextBuilder(tokenizer, REWARD_KEYS)


@pytest.fixture
def prompt(spider_prompts: list[SpiderPrompt]) -> SpiderPrompt:
    return spider_prompts[0]


RESPONSE = [19842, 314, 253, 3092, 2]  # arbitrary ids ending in <|im_end|>; they must come back unchanged


def test_full_context_holds_every_verifier_in_the_last_user_turn(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt
) -> None:
    contexts = builder.build(prompt.messages, RESPONSE, prompt.verifier_info)
    text = decoded(tokenizer, contexts.full_context_ids)
    user_turn = last_user_turn(text)
    assert user_turn.startswith(prompt.messages[0]["content"] + "\n\n" + HEADER + "\n\n")
    for key, info in zip(REWARD_KEYS, prompt.verifier_info, strict=True):
        assert f"[{key}]\n{info}" in user_turn
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert contexts.response_ids == tuple(RESPONSE)
    assert contexts.identical_to_full == (False, False, False)
    assert contexts.truncated == (False, False, False)


def test_leave_one_out_drops_exactly_its_own_verifier(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt
) -> None:
    contexts = builder.build(prompt.messages, RESPONSE, prompt.verifier_info)
    for k, key in enumerate(REWARD_KEYS):
        user_turn = last_user_turn(decoded(tokenizer, contexts.leave_one_out_ids[k]))
        assert HEADER in user_turn
        assert f"[{key}]" not in user_turn and prompt.verifier_info[k] not in user_turn
        for other, other_key in enumerate(REWARD_KEYS):
            if other != k:
                assert f"[{other_key}]\n{prompt.verifier_info[other]}" in user_turn
        assert len(contexts.leave_one_out_ids[k]) < len(contexts.full_context_ids)


def test_only_the_last_user_turn_gets_the_block(builder: ReplayContextBuilder, tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "You write SQL."},
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "First answer."},
        {"role": "user", "content": "Second question?"},
    ]
    contexts = builder.build(messages, RESPONSE, ["fmt info", "exec info", "gold info"])
    text = decoded(tokenizer, contexts.full_context_ids)
    assert text.count(HEADER) == 1
    assert "<|im_start|>user\nFirst question?<|im_end|>" in text
    assert last_user_turn(text).startswith("Second question?\n\n" + HEADER)


@pytest.mark.parametrize("as_type", [list, np.array, torch.tensor])
def test_token_id_prompt_gives_the_same_contexts_as_chat_messages(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt, as_type: Any
) -> None:
    from_messages = builder.build(prompt.messages, RESPONSE, prompt.verifier_info)
    from_ids = builder.build(as_type(prompt_ids(tokenizer, prompt.messages)), RESPONSE, prompt.verifier_info)
    assert from_ids == from_messages


def test_token_id_prompt_without_generation_prompt_is_refused(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt
) -> None:
    text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="end of a user turn and the generation prompt"):
        builder.build(ids, RESPONSE, prompt.verifier_info)


@pytest.mark.parametrize("empty", [None, "", "  \n\t "])
def test_empty_verifier_info_is_absent_everywhere(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt, empty: str | None
) -> None:
    infos = [prompt.verifier_info[0], empty, prompt.verifier_info[2]]
    contexts = builder.build(prompt.messages, RESPONSE, infos)
    assert contexts.identical_to_full == (False, True, False)
    assert contexts.leave_one_out_ids[1] == contexts.full_context_ids
    for ids in (contexts.full_context_ids, *contexts.leave_one_out_ids):
        assert "[executable]" not in decoded(tokenizer, ids)


def test_no_verifier_info_at_all_renders_the_plain_prompt(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt
) -> None:
    contexts = builder.build(prompt.messages, RESPONSE, [None, "", " "])
    assert contexts.full_context_ids == tuple(prompt_ids(tokenizer, prompt.messages))
    assert contexts.leave_one_out_ids == (contexts.full_context_ids,) * 3
    assert contexts.identical_to_full == (True, True, True)


@pytest.mark.parametrize("bad", [3, b"bytes", ["a list"]])
def test_non_string_info_is_a_type_error_naming_the_reward(
    builder: ReplayContextBuilder, prompt: SpiderPrompt, bad: Any
) -> None:
    with pytest.raises(TypeError, match="'correct'"):
        builder.build(prompt.messages, RESPONSE, ["ok", None, bad])


def test_wrong_number_of_infos_and_missing_user_turn_are_errors(
    builder: ReplayContextBuilder, prompt: SpiderPrompt
) -> None:
    with pytest.raises(ValueError, match="2 verifier-info texts for 3 rewards"):
        builder.build(prompt.messages, RESPONSE, ["a", "b"])
    with pytest.raises(ValueError, match="no user turn"):
        builder.build([{"role": "system", "content": "x"}], RESPONSE, ["a", "b", "c"])


def test_from_config_uses_header_template_and_budget(tokenizer: Any, prompt: SpiderPrompt) -> None:
    replay = ReplayConfig(verifier_header="## Checks", verifier_item_template="<{name}> {info}", max_context_tokens=999)
    builder = ReplayContextBuilder.from_config(tokenizer, REWARD_KEYS, replay)
    text = decoded(tokenizer, builder.build(prompt.messages, RESPONSE, ["A", None, "C"]).full_context_ids)
    assert last_user_turn(text).endswith("\n\n## Checks\n\n<format> A\n\n<correct> C")
    assert builder.max_context_tokens == 999


def _longest(contexts: ReplayContexts) -> int:
    return max(len(ids) for ids in (contexts.full_context_ids, *contexts.leave_one_out_ids))


def test_truncation_cuts_the_longest_verifier_text_and_keeps_prompt_and_response(
    tokenizer: Any, prompt: SpiderPrompt
) -> None:
    long_info = " ".join(f"row{i}" for i in range(300))
    infos = ["short format info", long_info, "gold info"]
    untruncated = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=100_000)
    full_length = len(untruncated.build(prompt.messages, RESPONSE, infos).full_context_ids) + len(RESPONSE)
    budget = full_length - 200
    builder = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=budget)

    contexts = builder.build(prompt.messages, RESPONSE, infos)

    assert contexts.truncated == (False, True, False)
    assert count_truncated_verifiers([contexts, contexts]) == 2
    assert _longest(contexts) + len(RESPONSE) <= budget
    assert _longest(contexts) + len(RESPONSE) > budget - 20  # the cap is the largest that fits, not just any
    assert contexts.response_ids == tuple(RESPONSE)
    user_turn = last_user_turn(decoded(tokenizer, contexts.full_context_ids))
    assert user_turn.startswith(prompt.messages[0]["content"])
    assert "short format info" in user_turn and "gold info" in user_turn
    assert "row0 row1 row2" in user_turn and "row299" not in user_turn and TRUNCATION_MARKER in user_turn


def test_truncation_cuts_long_texts_to_a_common_cap_longest_first(tokenizer: Any, prompt: SpiderPrompt) -> None:
    infos = [" ".join(["alpha"] * 120), " ".join(["beta"] * 60), "gamma"]
    untruncated = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=100_000)
    full_length = len(untruncated.build(prompt.messages, RESPONSE, infos).full_context_ids) + len(RESPONSE)
    builder = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=full_length - 90)

    contexts = builder.build(prompt.messages, RESPONSE, infos)

    assert contexts.truncated == (True, True, False)
    user_turn = last_user_turn(decoded(tokenizer, contexts.full_context_ids))
    assert abs(user_turn.count("alpha") - user_turn.count("beta")) <= 2  # cut to the same number of tokens


def test_impossible_budget_is_a_clear_error(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt
) -> None:
    prompt_length = len(prompt_ids(tokenizer, prompt.messages))
    tight = ReplayContextBuilder(tokenizer, REWARD_KEYS, max_context_tokens=prompt_length + len(RESPONSE) + 3)
    with pytest.raises(ValueError, match=r"does not fit max_context_tokens=.*raise mrtpo\.replay\.max_context_tokens"):
        tight.build(prompt.messages, RESPONSE, prompt.verifier_info)


def test_build_batch_keeps_order_and_checks_lengths(builder: ReplayContextBuilder, prompt: SpiderPrompt) -> None:
    infos = [["a", "b", "c"], [None, "b", None]]
    batch = builder.build_batch([prompt.messages] * 2, [RESPONSE, RESPONSE[:2]], infos)
    assert [item.identical_to_full for item in batch] == [(False, False, False), (True, False, True)]
    assert batch[1].response_ids == tuple(RESPONSE[:2])
    with pytest.raises(ValueError, match="batch sizes differ"):
        builder.build_batch([prompt.messages], [RESPONSE, RESPONSE], infos)


info_texts = st.one_of(st.none(), st.text(alphabet="abc XYZ019\n.,;:'()=*", max_size=40))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(infos=st.lists(info_texts, min_size=3, max_size=3))
def test_property_context_identity_follows_empty_info(
    builder: ReplayContextBuilder, tokenizer: Any, prompt: SpiderPrompt, infos: list[str | None]
) -> None:
    contexts = builder.build(prompt.messages, RESPONSE, infos)
    full_text = decoded(tokenizer, contexts.full_context_ids)
    for k, info in enumerate(infos):
        empty = info is None or not info.strip()
        assert contexts.identical_to_full[k] == empty
        assert (contexts.leave_one_out_ids[k] == contexts.full_context_ids) == empty
        assert (f"[{REWARD_KEYS[k]}]" in full_text) == (not empty)
        if not empty:
            assert info is not None and info.strip() in full_text
    assert contexts.response_ids == tuple(RESPONSE)

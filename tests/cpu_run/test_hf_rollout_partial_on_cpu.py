"""The CPU ``hf`` rollout honours verl's partial-rollout protocol: abort, hold, resume, continue.

verl's asynchronous trainers call ``abort_all_requests`` on every replica when sampling ends and
``resume_generation`` after the weight push; ``FullyAsyncLLMServerClient`` re-sends an aborted
request as prompt + partial response with the remaining token budget. Here the real
:class:`HFLLMServer` (in this process, without Ray) on a 2-layer model derived from the embedded
SmolLM2 goes through that protocol; greedy decoding makes the continued response comparable with
an uninterrupted one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mrtpo_cpu.launch import save_derived_model
from mrtpo_cpu.rollout import HFLLMServer

MAX_TOKENS = 300
GREEDY = {"temperature": 0.0, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> HFLLMServer:
    model = save_derived_model(Path(tmp_path_factory.mktemp("hf_rollout")) / "model", num_layers=2)
    return HFLLMServer(str(model), prompt_length=64, response_length=MAX_TOKENS, torch_threads=1)


def prompt_ids(server: HFLLMServer) -> list[int]:
    messages = [{"role": "user", "content": "Count from one to two hundred in words."}]
    text = server.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(server.tokenizer(text, add_special_tokens=False)["input_ids"])


async def wait_until_running(server: HFLLMServer) -> None:
    while not server._lock.locked():
        await asyncio.sleep(0.005)


def test_abort_returns_the_partial_response_and_resume_continues_it(server: HFLLMServer) -> None:
    prompt = prompt_ids(server)

    async def scenario():
        reference = await server.generate("ref", prompt, dict(GREEDY))
        first = asyncio.create_task(server.generate("r1", prompt, dict(GREEDY)))
        await wait_until_running(server)
        await asyncio.sleep(0.1)
        await server.abort_all_requests()
        partial = await first
        held = asyncio.create_task(server.generate("r2", prompt, {"temperature": 0.0, "max_tokens": 4}))
        await asyncio.sleep(0.3)
        held_while_paused = not held.done()
        await server.resume_generation()
        # What FullyAsyncLLMServerClient sends next: prompt + partial, the remaining budget.
        rest = await server.generate(
            "r1", prompt + partial.token_ids, {**GREEDY, "max_tokens": MAX_TOKENS - len(partial.token_ids)}
        )
        return reference, partial, held_while_paused, await held, rest

    reference, partial, held_while_paused, held, rest = asyncio.run(scenario())
    # Precondition of the comparison: the uninterrupted greedy response runs to the budget (no EOS).
    assert reference.stop_reason == "completed" and len(reference.token_ids) == MAX_TOKENS
    assert partial.stop_reason == "aborted" and 0 < len(partial.token_ids) < MAX_TOKENS
    assert held_while_paused and held.stop_reason == "completed" and len(held.token_ids) == 4
    assert partial.token_ids + rest.token_ids == reference.token_ids


def test_reject_request_answers_aborted_at_once_until_resume(server: HFLLMServer) -> None:
    prompt = prompt_ids(server)

    async def scenario():
        await server.abort_all_requests(reject_request=True)
        rejected = await asyncio.wait_for(server.generate("r", prompt, {"temperature": 0.0, "max_tokens": 4}), 5)
        await server.resume_generation()
        accepted = await server.generate("r", prompt, {"temperature": 0.0, "max_tokens": 4})
        return rejected, accepted

    rejected, accepted = asyncio.run(scenario())
    assert (rejected.stop_reason, rejected.token_ids) == ("aborted", [])
    assert accepted.stop_reason == "completed" and len(accepted.token_ids) == 4

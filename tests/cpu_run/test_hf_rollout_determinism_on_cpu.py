"""The CPU ``hf`` rollout under verl's ``full_determinism``: a sample depends on its request, not on arrival order.

verl's agent loops name each request ``det-<priority>`` (the sample's index in the step's batch) when
``rollout.full_determinism`` is on. The real :class:`HFLLMServer` (in this process, without Ray) on a
2-layer model derived from the embedded SmolLM2 samples the same requests in two orders; each request
must get the same tokens both times, and requests with the same prompt but other ids must differ (a
group of ``n`` responses is not ``n`` copies). Without full determinism the server keeps one stream
in arrival order, and the order shows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mrtpo_verl.cpu_support.launch import save_derived_model
from mrtpo_verl.cpu_support.rollout import HFLLMServer, request_seed

SAMPLED = {"temperature": 1.0, "max_tokens": 24}
IDS = [f"det-{priority}" for priority in range(6)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_derived_model(Path(tmp_path_factory.mktemp("hf_det")) / "model", num_layers=2)


def prompt_ids(server: HFLLMServer) -> list[int]:
    messages = [{"role": "user", "content": "Name a colour and a fruit."}]
    text = server.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(server.tokenizer(text, add_special_tokens=False)["input_ids"])


def sample_in_order(server: HFLLMServer, order: list[str]) -> dict[str, list[int]]:
    prompt = prompt_ids(server)

    async def run() -> dict[str, list[int]]:
        outputs = {}
        for request_id in order:
            outputs[request_id] = (await server.generate(request_id, prompt, dict(SAMPLED))).token_ids
        return outputs

    return asyncio.run(run())


def test_each_request_samples_the_same_tokens_in_any_arrival_order(model_dir: Path) -> None:
    server = HFLLMServer(str(model_dir), prompt_length=64, response_length=24, seed=7, full_determinism=True)
    forward = sample_in_order(server, IDS)
    backward = sample_in_order(server, IDS[::-1])
    assert forward == backward
    # Same prompt, other sample: other tokens (six identical responses would be a broken group).
    assert len({tuple(tokens) for tokens in forward.values()}) > 1
    # New weights (a step later): the same ids sample afresh.
    server.weight_version += 1
    assert sample_in_order(server, IDS) != forward


def test_a_fresh_server_with_the_same_seed_samples_the_same(model_dir: Path) -> None:
    first = HFLLMServer(str(model_dir), prompt_length=64, response_length=24, seed=7, full_determinism=True)
    second = HFLLMServer(str(model_dir), prompt_length=64, response_length=24, seed=7, full_determinism=True)
    other_seed = HFLLMServer(str(model_dir), prompt_length=64, response_length=24, seed=8, full_determinism=True)
    reference = sample_in_order(first, IDS)
    assert sample_in_order(second, IDS[::-1]) == reference
    assert sample_in_order(other_seed, IDS) != reference


def test_without_full_determinism_arrival_order_decides(model_dir: Path) -> None:
    server = HFLLMServer(str(model_dir), prompt_length=64, response_length=24, seed=7)
    forward = sample_in_order(server, IDS)
    server_again = HFLLMServer(str(model_dir), prompt_length=64, response_length=24, seed=7)
    backward = sample_in_order(server_again, IDS[::-1])
    # One stream in arrival order: the first request served gets the stream's start either way.
    assert forward[IDS[0]] == backward[IDS[-1]]
    assert forward != backward


def test_request_seed_names_its_inputs() -> None:
    base = request_seed(7, 1, 3, "det-0")
    assert 0 <= base < 2**63
    assert base == request_seed(7, 1, 3, "det-0")
    changed_one_input = [
        request_seed(8, 1, 3, "det-0"),
        request_seed(7, 2, 3, "det-0"),
        request_seed(7, 1, 4, "det-0"),
        request_seed(7, 1, 3, "det-1"),
    ]
    assert len({base, *changed_one_input}) == 5

"""The CPU ``hf`` rollout under verl's ``full_determinism``: a sample depends on its request, not on arrival order.

verl's agent loops name each request ``det-<priority>`` when ``rollout.full_determinism`` is on; its v1
trainers give all ``n`` responses of a prompt (and prompts without a priority) the same id, ``det-0``.
Fresh real :class:`HFLLMServer` instances (in this process, without Ray) on a 2-layer model derived from
the embedded SmolLM2 sample the same requests in different orders; each request must get the same tokens
every time, and the responses of one prompt must differ from each other (a group of ``n`` responses is
not ``n`` copies). Without full determinism the server keeps one stream in arrival order, and the order
shows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mrtpo_cpu.launch import save_derived_model
from mrtpo_cpu.rollout import HFLLMServer, request_seed

SAMPLED = {"temperature": 1.0, "max_tokens": 24}
IDS = [f"det-{priority}" for priority in range(6)]
QUESTIONS = {"a": "Name a colour and a fruit.", "b": "Say something about the sea."}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_derived_model(Path(tmp_path_factory.mktemp("hf_det")) / "model", num_layers=2)


def server(model_dir: Path, seed: int = 7, full_determinism: bool = True) -> HFLLMServer:
    return HFLLMServer(
        str(model_dir), prompt_length=64, response_length=24, seed=seed, full_determinism=full_determinism
    )


def prompt_ids(server: HFLLMServer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    text = server.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(server.tokenizer(text, add_special_tokens=False)["input_ids"])


def sample(server: HFLLMServer, requests: list[tuple[str, str]]) -> dict[tuple[str, str], list[list[int]]]:
    """Each (request id, question) in order; per pair, the token lists in the order they were served."""

    async def run() -> dict[tuple[str, str], list[list[int]]]:
        outputs: dict[tuple[str, str], list[list[int]]] = {}
        for request_id, question in requests:
            output = await server.generate(request_id, prompt_ids(server, QUESTIONS[question]), dict(SAMPLED))
            outputs.setdefault((request_id, question), []).append(output.token_ids)
        return outputs

    return asyncio.run(run())


def distinct(token_lists: list[list[int]]) -> int:
    return len({tuple(tokens) for tokens in token_lists})


def test_each_request_samples_the_same_tokens_in_any_arrival_order(model_dir: Path) -> None:
    forward = sample(server(model_dir), [(request_id, "a") for request_id in IDS])
    backward = sample(server(model_dir), [(request_id, "a") for request_id in IDS[::-1]])
    assert forward == backward
    # Same prompt, other sample: other tokens (six identical responses would be a broken group).
    assert distinct([tokens for (tokens,) in forward.values()]) > 1


def test_one_id_for_every_response_as_verl_v1_sends_them(model_dir: Path) -> None:
    """Two prompts, four responses each, all under ``det-0``, grouped or interleaved: each prompt's k-th
    response is the same, and its four responses are not four copies."""
    grouped = sample(server(model_dir), [("det-0", question) for question in "aaaabbbb"])
    interleaved = sample(server(model_dir), [("det-0", question) for question in "babababa"])
    assert grouped == interleaved
    assert distinct(grouped[("det-0", "a")]) > 1 and distinct(grouped[("det-0", "b")]) > 1


def test_new_weights_and_another_seed_sample_afresh(model_dir: Path) -> None:
    requests = [(request_id, "a") for request_id in IDS]
    first = server(model_dir)
    reference = sample(first, requests)
    first.weight_version += 1  # what a weight load does: the counts and seeds of a new step
    assert sample(first, requests) != reference
    assert sample(server(model_dir, seed=8), requests) != reference


def test_without_full_determinism_arrival_order_decides(model_dir: Path) -> None:
    forward = sample(server(model_dir, full_determinism=False), [(request_id, "a") for request_id in IDS])
    backward = sample(server(model_dir, full_determinism=False), [(request_id, "a") for request_id in IDS[::-1]])
    # One stream in arrival order: the first request served gets the stream's start either way.
    assert forward[(IDS[0], "a")] == backward[(IDS[-1], "a")]
    assert forward != backward


def test_request_seed_names_its_inputs() -> None:
    base = request_seed(7, 1, 3, "det-0", [1, 2], 0)
    assert 0 <= base < 2**63
    assert base == request_seed(7, 1, 3, "det-0", [1, 2], 0)
    changed_one_input = [
        request_seed(8, 1, 3, "det-0", [1, 2], 0),
        request_seed(7, 2, 3, "det-0", [1, 2], 0),
        request_seed(7, 1, 4, "det-0", [1, 2], 0),
        request_seed(7, 1, 3, "det-1", [1, 2], 0),
        request_seed(7, 1, 3, "det-0", [1, 3], 0),
        request_seed(7, 1, 3, "det-0", [1, 2], 1),
    ]
    assert len({base, *changed_one_input}) == 1 + len(changed_one_input)

"""Session fixtures for the replay tests: the real SmolLM2-135M-Instruct, real Spider prompts, its own responses.

The model is loaded once per session (about 10 s on CPU) and the responses are generated once (greedy,
16 new tokens) from the prompts without verifier information, as a rollout would.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from mrtpo_verl.replay.contexts import ReplayContextBuilder, ReplayContexts
from mrtpo_verl.replay.model_loading import load_causal_lm

SPIDER_DIR = Path(__file__).resolve().parents[2] / "reward_fns" / "data" / "spider"
#: Line numbers (0-based) in dev_subset.jsonl of the questions replayed: concert_singer and pets_1.
SPIDER_LINES = (0, 45)
REWARD_KEYS = ("format", "executable", "correct")
NEW_TOKENS = 16


@dataclass(frozen=True)
class SpiderPrompt:
    """A real text-to-SQL prompt with verifier-like information per reward (in REWARD_KEYS order)."""

    messages: list[dict[str, str]]
    verifier_info: tuple[str | None, ...]


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch single-threaded, then restore the previous thread count.

    The test machines have 2 shared cores. Under load from other processes, two OpenMP threads stall at
    every barrier (measured: a 135M-parameter prefill 10x slower than with one thread), while a model this
    small gains little from intra-op parallelism when the cores are free.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="package", autouse=True)
def _single_threaded_replay_tests() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any]:
    """(model, tokenizer): SmolLM2-135M-Instruct dequantised to float32, eval mode."""
    with one_torch_thread():
        return load_causal_lm()


@pytest.fixture(scope="session")
def spider_prompts() -> list[SpiderPrompt]:
    lines = (SPIDER_DIR / "dev_subset.jsonl").read_text().splitlines()
    return [_spider_prompt(json.loads(lines[i])) for i in SPIDER_LINES]


@pytest.fixture(scope="session")
def generated_responses(smollm2: tuple[Any, Any], spider_prompts: list[SpiderPrompt]) -> list[list[int]]:
    """The model's own greedy responses to each prompt (no verifier information in the prompt)."""
    model, tokenizer = smollm2
    responses = []
    for prompt in spider_prompts:
        text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.inference_mode():
            output = model.generate(
                prompt_ids,
                attention_mask=torch.ones_like(prompt_ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
        responses.append(output[0, prompt_ids.shape[1] :].tolist())
    return responses


@pytest.fixture(scope="session")
def replay_items(
    smollm2: tuple[Any, Any], spider_prompts: list[SpiderPrompt], generated_responses: list[list[int]]
) -> list[ReplayContexts]:
    """Two responses: the first prompt's with all verifier information, the second's without 'executable' info.

    Kept to two (7 forward passes per replay) so that the scorer tests stay fast on 2 CPU cores.
    """
    _, tokenizer = smollm2
    builder = ReplayContextBuilder(tokenizer, REWARD_KEYS)
    format_info, _, correct_info = spider_prompts[1].verifier_info
    return [
        builder.build(spider_prompts[0].messages, generated_responses[0], spider_prompts[0].verifier_info),
        builder.build(spider_prompts[1].messages, generated_responses[1], [format_info, None, correct_info]),
    ]


def _spider_prompt(example: dict[str, str]) -> SpiderPrompt:
    database = SPIDER_DIR / f"{example['db_id']}.sqlite"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        tables = connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        rows = connection.execute(example["query"]).fetchall()
    used_tables = [sql for name, sql in tables if name.lower() in example["query"].lower()]
    messages = [{"role": "user", "content": f"{example['question']} Answer with one SQLite query in a ```sql block."}]
    verifier_info = (
        "The answer must contain exactly one SQL query inside a ```sql code block.",
        f"Database {example['db_id']} (SQLite):\n" + "\n".join(used_tables),
        f"Reference query: {example['query']}\nReference result: {rows}",
    )
    return SpiderPrompt(messages=messages, verifier_info=verifier_info)

"""One real text-to-SQL replay at a chosen context length, and its relevance in each compute dtype.

The long-context rows of ``python -m benchmarks.replay_numerics`` and the CI test
``tests/replay/test_long_context_compute_on_cpu.py`` build their item and compute its relevance here, so the
documented figures and the test's come from one code path. The item is real Spider data (the dev questions and
databases packaged with :mod:`reward_fns.text_to_sql`): worked examples fill the user turn up to the wanted length.
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import nullcontext
from typing import Any

import torch

from mrtpo_verl.replay.contexts import ReplayContextBuilder
from mrtpo_verl.replay.product_rule import emulated_products
from mrtpo_verl.replay.scorer import ReplayScorer
from reward_fns.text_to_sql.ground_truth import BUNDLED_DB_ROOT

__all__ = ["LONG_CONTEXT_KEYS", "long_context_item", "long_context_relevance"]

LONG_CONTEXT_KEYS = ("format", "executable", "correct")
"""The three verifier blocks of a long-context item (text-to-SQL's rewards)."""


def _spider_examples() -> list[dict[str, str]]:
    return [json.loads(line) for line in (BUNDLED_DB_ROOT / "dev_subset.jsonl").read_text().splitlines()]


def _spider_verifiers(example: dict[str, str]) -> tuple[str, str, str]:
    """The text-to-SQL family's three verifier texts for ``example``: format, the schema, the reference query and
    its result (read from the real Spider database)."""
    database = BUNDLED_DB_ROOT / f"{example['db_id']}.sqlite"
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as connection:
        tables = connection.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
        rows = connection.execute(example["query"]).fetchall()
    return (
        "The answer must contain exactly one SQL query inside a ```sql code block.",
        f"Database {example['db_id']} (SQLite):\n" + "\n".join(sql for _, sql in tables),
        f"Reference query: {example['query']}\nReference result: {rows[:20]}",
    )


def long_context_item(tokenizer: Any, response_start: int, question: int = 66) -> Any:
    """One real Spider replay whose response starts at about ``response_start`` (± a few tokens): the user turn is
    worked examples (real Spider questions and reference queries of the other databases, in file order) up to that
    length, then the question; three verifier blocks (format, schema, reference query and result) follow it; the
    response is the reference query in a ```sql block (its tokens, not the model's sample).

    Returns:
        :class:`~mrtpo_verl.replay.contexts.ReplayContexts` with K = 3 real leave-one-out contexts.
    """
    examples = _spider_examples()
    target = examples[question]
    shots = [e for e in examples if e["db_id"] != target["db_id"]]
    verifiers = _spider_verifiers(target)
    builder = ReplayContextBuilder(tokenizer, LONG_CONTEXT_KEYS)
    response = tokenizer(f"```sql\n{target['query']}\n```", add_special_tokens=False)["input_ids"]

    def build(count: int) -> Any:
        worked = "".join(f"Question: {e['question']}\nSQL: {e['query']}\n\n" for e in shots[:count])
        content = (
            f"Examples of questions and their SQLite queries:\n\n{worked}"
            f"{target['question']} Answer with one SQLite query in a ```sql block."
        )
        return builder.build([{"role": "user", "content": content}], response, verifiers)

    low, high = 0, len(shots)
    if len(build(high).full_context_ids) < response_start:
        raise ValueError(f"the Spider examples reach fewer than {response_start} tokens")
    while low < high:  # fewest worked examples whose full context reaches response_start
        middle = (low + high) // 2
        if len(build(middle).full_context_ids) < response_start:
            low = middle + 1
        else:
            high = middle
    return build(low)


def long_context_relevance(model32: Any, item: Any, mode: str, sharded: Any = None) -> torch.Tensor:
    """(1, 3, T) relevance of ``item`` through the public :class:`ReplayScorer` in one of
    :data:`LONG_CONTEXT_MODES` (``"reference"``: the float32 model, IEEE float32)."""
    needed = torch.ones(1, len(LONG_CONTEXT_KEYS), dtype=torch.bool)
    model, compute_dtype, emulate = {
        "reference": (model32, "fp32", False),
        "fp16": (model32, "fp16", False),
        "tf32 (emulated)": (model32, "tf32", True),
        "fp32 (colocated FSDP2)": (sharded, "fp32", False),
    }[mode]
    with torch.no_grad(), emulated_products() if emulate else nullcontext():
        return ReplayScorer(model, compute_dtype=compute_dtype).score([item], needed).relevance

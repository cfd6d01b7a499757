"""A real verl batch for replay and trainer tests: SmolLM2-135M-Instruct answers real Spider questions.

The prompts are real Spider dev questions with their database schema, the responses are sampled
by the embedded model, the rewards and verifier information come from our text-to-SQL verifier
on the real SQLite databases. Nothing here is mocked.
"""

from __future__ import annotations

import json
import sqlite3
from functools import lru_cache
from pathlib import Path

import torch
from verl import DataProto

from mrtpo_verl.demo.batch import SampledResponse, pack_batch
from mrtpo_verl.demo.tasks import DemoPrompt
from reward_fns import dispatch
from reward_fns.text_to_sql import BUNDLED_DB_ROOT

REWARD_KEYS = ("sql_format", "sql_execution")
INFO_KEYS = tuple(dispatch.info_key(k) for k in REWARD_KEYS)
QUESTION_INDICES = (0, 4)  # "How many singers do we have?", "average, minimum, and maximum age ... France"


@lru_cache(maxsize=1)
def smollm2() -> tuple[object, object]:
    from mrtpo_verl.replay.model_loading import load_causal_lm

    model, tokenizer = load_causal_lm(None)
    model.eval()
    return model, tokenizer


def spider_questions() -> list[dict]:
    lines = (Path(BUNDLED_DB_ROOT) / "dev_subset.jsonl").read_text().splitlines()
    return [json.loads(lines[i]) for i in QUESTION_INDICES]


def schema(db_id: str, tables: tuple[str, ...] = ("singer",)) -> str:
    """Compact schema lines like ``singer(Singer_ID, Name, ...)``: short prompts keep CPU replays cheap."""
    path = Path(BUNDLED_DB_ROOT) / f"{db_id}.sqlite"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:
        lines = [f"{t}({', '.join(row[1] for row in connection.execute(f'PRAGMA table_info({t})'))})" for t in tables]
    return "\n".join(lines)


def chat_prompt(example: dict) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": f"Table {schema(example['db_id'])}. {example['question']} Answer with one ```sql block.",
        },
    ]


@lru_cache(maxsize=4)
def real_sql_batch(max_new_tokens: int = 16) -> DataProto:
    """Two groups of two: the model's own greedy answer and the gold query in a fence, per question.

    The model's answers rarely satisfy the verifier while the gold ones do, so every reward varies
    inside every group and the replay has real work (no pair is skipped). Packed by the demo's
    :func:`~mrtpo_verl.demo.batch.pack_batch` (verl's layout, uid ``prompt-<question>``).
    """
    model, tokenizer = smollm2()
    prompts, responses = [], []
    for g, example in enumerate(spider_questions()):
        gold_sql = f"```sql\n{example['query']}\n```"
        prompt = DemoPrompt(
            task="text_to_sql",
            data_source="spider/dev",
            messages=chat_prompt(example),
            ground_truth={"sql": example["query"], "db_id": example["db_id"]},
            reference=gold_sql,
        )
        ids = tokenizer.apply_chat_template(
            prompt.messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        prompt_ids = ids["input_ids"][0]
        with torch.inference_mode():
            generated = model.generate(
                input_ids=prompt_ids[None],
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(prompt_ids) :].tolist()
        gold = [*tokenizer(gold_sql, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        for response, label in ((generated, "greedy"), (gold, "gold query")):
            text = tokenizer.decode(response, skip_special_tokens=True)
            scores = dispatch.compute_score(prompt.data_source, text, prompt.ground_truth, families=["text_to_sql"])
            responses.append(SampledResponse(g, prompt_ids.tolist(), response, label, scores))
        prompts.append(prompt)
    return pack_batch(responses, prompts, REWARD_KEYS, tokenizer.pad_token_id)

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

import numpy as np
import torch
from verl import DataProto

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
    inside every group and the replay has real work (no pair is skipped).
    """
    model, tokenizer = smollm2()
    prompts, responses, raw_prompts, uids, scores = [], [], [], [], []
    for g, example in enumerate(spider_questions()):
        messages = chat_prompt(example)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        prompt_ids = ids["input_ids"][0]
        with torch.inference_mode():
            generated = model.generate(
                input_ids=prompt_ids[None],
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(prompt_ids) :].tolist()
        gold = tokenizer(f"```sql\n{example['query']}\n```", add_special_tokens=False)["input_ids"]
        for response in (generated, [*gold, tokenizer.eos_token_id]):
            text = tokenizer.decode(response, skip_special_tokens=True)
            ground_truth = {"sql": example["query"], "db_id": example["db_id"]}
            scores.append(dispatch.compute_score("spider/dev", text, ground_truth, families=["text_to_sql"]))
            prompts.append(prompt_ids.tolist())
            responses.append(response)
            raw_prompts.append(messages)
            uids.append(f"q{g}")
    return _to_dataproto(prompts, responses, raw_prompts, uids, scores, tokenizer.pad_token_id)


def _to_dataproto(prompts, responses, raw_prompts, uids, scores, pad_id) -> DataProto:
    bs, width_p, width_r = len(prompts), max(map(len, prompts)), max(map(len, responses))
    prompt_tensor = torch.full((bs, width_p), pad_id)
    prompt_mask = torch.zeros(bs, width_p, dtype=torch.long)
    response_tensor = torch.full((bs, width_r), pad_id)
    response_mask = torch.zeros(bs, width_r, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        prompt_tensor[i, width_p - len(p) :] = torch.tensor(p)  # verl left-pads prompts
        prompt_mask[i, width_p - len(p) :] = 1
        response_tensor[i, : len(r)] = torch.tensor(r)
        response_mask[i, : len(r)] = 1
    raw = np.empty(bs, dtype=object)
    raw[:] = raw_prompts
    non_tensors = {"uid": np.array(uids, dtype=object), "raw_prompt": raw}
    for key in REWARD_KEYS:
        non_tensors[key] = np.array([s[key] for s in scores], dtype=np.float64)
        non_tensors[dispatch.info_key(key)] = np.array([s[dispatch.info_key(key)] for s in scores], dtype=object)
    tensors = {
        "prompts": prompt_tensor,
        "responses": response_tensor,
        "response_mask": response_mask,
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "token_level_rewards": torch.zeros(bs, width_r),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)

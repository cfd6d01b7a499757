"""What the arms train on: the built demo task, or a recipe's prepared data and reward functions.

The demo task (``if_pair``) is built from data the project ships: the short questions of the
bundled Spider subset (``reward_fns/data/spider/dev_subset.jsonl``), each followed by the same two
IFEval instructions in IFEval's own wording. The instruction-following verifier scores each
instruction as its own reward (``if_c0``, ``if_c1``), so the two rewards' evidence sits on different
tokens: one of three fixed answers ("My answer is yes." ...) that opens the response, and a
postscript starting with "P.S." that closes it. Both fit in a few tokens, so responses can be short,
and SmolLM2-135M-Instruct meets each in a minority of its sampled answers (about 25% and 38% of 48
samples at temperature 1, 32 tokens), so both can be learnt. IFEval's title instruction is not used:
greedy answers meet it on every evaluation prompt before any training.
Records are written in IFEval's schema and converted by the recipes' own
``recipes/data/prepare_instruction_following.py``, exactly as a user's ``.jsonl`` would be. Train and
evaluation questions are disjoint.

A recipe task (``--recipe text_to_sql|tool_calling|instruction_following``) reads the recipe's
``train.parquet``/``test.parquet`` (``recipes/data/prepare_*.py``) and scores with the recipe's reward
family and keys (``reward_fns.dispatch``), like ``recipes/<task>/common.sh``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEMO_CONSTRAINTS", "RECIPE_FAMILIES", "Task", "build_demo_task", "recipe_task"]

REPO = Path(__file__).resolve().parents[2]
SPIDER_QUESTIONS = REPO / "reward_fns" / "data" / "spider" / "dev_subset.jsonl"

#: The demo task's two instructions (IFEval ids and arguments): reward ``if_c0`` is about the first
#: tokens of the answer, ``if_c1`` about its last ones.
DEMO_CONSTRAINTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("detectable_format:constrained_response", {}),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}),
)

#: Recipe task folder -> reward family of ``reward_fns.dispatch`` (as in ``recipes/<task>/common.sh``).
RECIPE_FAMILIES = {
    "text_to_sql": "text_to_sql",
    "tool_calling": "tool_calling",
    "instruction_following": "instruction_following",
}


@dataclass(frozen=True)
class Task:
    """Data files and reward settings shared by every arm.

    Attributes:
        name: shown in the report.
        train_file, val_file: verl RL parquet files (``data.train_files`` / ``data.val_files``).
        family: the ``reward_fns.dispatch`` family.
        reward_keys: the rewards compared (``mrtpo.reward_keys``; GDPO's ``gdpo_reward_keys``).
        max_constraints: instruction following's slot count (None for other families).
        prompt_length: the longest chat-rendered prompt in tokens (``data.max_prompt_length``).
        val_sources: evaluation rows per ``data_source`` (verl logs validation means per source).
    """

    name: str
    train_file: Path
    val_file: Path
    family: str
    reward_keys: tuple[str, ...]
    max_constraints: int | None
    prompt_length: int
    val_sources: dict[str, int]

    @property
    def info_keys(self) -> tuple[str, ...]:
        from reward_fns.dispatch import info_key

        return tuple(info_key(key) for key in self.reward_keys)

    def reward_overrides(self) -> list[str]:
        """verl's custom reward function = ``reward_fns.dispatch`` on this family, and MRTPO's keys."""
        from mrtpo_verl.cpu_support.launch import reward_overrides

        overrides = reward_overrides([self.family], self.reward_keys, self.info_keys)
        if self.max_constraints is not None:
            overrides.append(f"+reward.custom_reward_function.reward_kwargs.max_constraints={self.max_constraints}")
        return overrides

    def describe(self) -> dict:
        return {
            "name": self.name,
            "train_file": str(self.train_file),
            "val_file": str(self.val_file),
            "family": self.family,
            "reward_keys": list(self.reward_keys),
            "prompt_length": self.prompt_length,
            "val_sources": self.val_sources,
        }


def spider_questions() -> list[str]:
    """The bundled Spider questions, each once, shortest first (ties in file order)."""
    seen: dict[str, None] = {}
    for line in SPIDER_QUESTIONS.read_text(encoding="utf-8").splitlines():
        if line.strip():
            seen.setdefault(json.loads(line)["question"].strip(), None)
    return sorted(seen, key=len)


def demo_records(questions: Sequence[str]) -> list[dict]:
    """IFEval-schema records: each question followed by the two instructions' IFEval descriptions."""
    from reward_fns.instruction_following.checkers import check_constraint

    descriptions = [check_constraint(cid, kwargs, "", "x").description for cid, kwargs in DEMO_CONSTRAINTS]
    records = []
    for index, question in enumerate(questions):
        prompt = f"{question} {' '.join(descriptions)}"
        records.append(
            {
                "key": index,
                "prompt": prompt,
                "instruction_id_list": [cid for cid, _ in DEMO_CONSTRAINTS],
                "kwargs": [dict(kwargs) for _, kwargs in DEMO_CONSTRAINTS],
            }
        )
    return records


def build_demo_task(out_dir: Path, model_dir: Path, train_prompts: int, val_prompts: int) -> Task:
    """Write the demo task's parquet files under ``out_dir`` (the shortest questions; evaluation takes
    every other one of the first ``2 * val_prompts``, so both splits cover the same lengths)."""
    questions = spider_questions()
    if len(questions) < train_prompts + val_prompts:
        raise ValueError(
            f"the Spider subset has {len(questions)} distinct questions; {train_prompts} train + {val_prompts} "
            "evaluation prompts asked"
        )
    head = questions[: 2 * val_prompts]
    val = head[1::2]
    train = (head[0::2] + questions[2 * val_prompts :])[:train_prompts]
    source = out_dir / "source"
    source.mkdir(parents=True, exist_ok=True)
    prepared = out_dir / "data"
    changed = False
    for split, items in (("train", train), ("test", val)):
        text = "".join(json.dumps(record) + "\n" for record in demo_records(items))
        path = source / f"{split}.jsonl"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed = True
    if changed or not all((prepared / f"{split}.parquet").is_file() for split in ("train", "test")):
        prepare_with_recipe_script(source, prepared)
    from reward_fns.dispatch import reward_keys

    return finish_task(
        "if_pair (Spider questions + IFEval fixed-answer and postscript instructions)",
        prepared / "train.parquet",
        prepared / "test.parquet",
        "instruction_following",
        reward_keys(["instruction_following"], len(DEMO_CONSTRAINTS)),
        len(DEMO_CONSTRAINTS),
        model_dir,
    )


def prepare_with_recipe_script(source: Path, prepared: Path) -> None:
    """``recipes/data/prepare_instruction_following.py`` on the demo task's two ``.jsonl`` files."""
    subprocess.run(
        [
            sys.executable,
            str(REPO / "recipes" / "data" / "prepare_instruction_following.py"),
            "--train",
            str(source / "train.jsonl"),
            "--test",
            str(source / "test.jsonl"),
            "--max-constraints",
            str(len(DEMO_CONSTRAINTS)),
            "--output-dir",
            str(prepared),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
    )


def recipe_task(
    recipe: str,
    train_file: Path,
    val_file: Path,
    model_dir: Path,
    out_dir: Path,
    val_prompts: int | None,
    max_constraints: int = 3,
    reward_keys: Sequence[str] | None = None,
) -> Task:
    """A recipe's prepared data with its reward family (``reward_keys``: a subset of the family's keys).

    ``val_prompts`` keeps the first rows of the (already shuffled) test split, written under ``out_dir``.
    """
    import pandas as pd

    from reward_fns import dispatch

    if recipe not in RECIPE_FAMILIES:
        raise ValueError(f"unknown recipe {recipe!r}; choose from {list(RECIPE_FAMILIES)}")
    for path in (train_file, val_file):
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist; prepare it with python recipes/data/prepare_{recipe}.py --output-dir <dir>"
            )
    family = RECIPE_FAMILIES[recipe]
    constraints = max_constraints if family == "instruction_following" else None
    keys = dispatch.reward_keys([family], constraints)
    if reward_keys:
        unknown = [key for key in reward_keys if key not in keys]
        if unknown:
            raise ValueError(f"reward key(s) {unknown} are not {family}'s; its keys: {list(keys)}")
        keys = tuple(reward_keys)
    if val_prompts is not None:
        frame = pd.read_parquet(val_file)
        out_dir.mkdir(parents=True, exist_ok=True)
        subset = out_dir / "val.parquet"
        frame.head(val_prompts).to_parquet(subset, index=False)
        val_file = subset
    return finish_task(recipe, train_file, val_file, family, keys, constraints, model_dir)


def finish_task(
    name: str,
    train_file: Path,
    val_file: Path,
    family: str,
    keys: Sequence[str],
    max_constraints: int | None,
    model_dir: Path,
) -> Task:
    """Measure the longest prompt and count the evaluation rows per data source."""
    import pandas as pd
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    longest = 0
    for path in (train_file, val_file):
        for messages in pd.read_parquet(path)["prompt"]:
            # Rendered text, then tokenized: apply_chat_template(tokenize=True) returns a dict in recent transformers.
            text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
            longest = max(longest, len(tokenizer(text)["input_ids"]))
    sources = Counter(str(source) for source in pd.read_parquet(val_file)["data_source"])
    return Task(
        name=name,
        train_file=train_file,
        val_file=val_file,
        family=family,
        reward_keys=tuple(keys),
        max_constraints=max_constraints,
        prompt_length=longest,
        val_sources=dict(sources),
    )

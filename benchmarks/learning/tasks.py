"""What the arms train on: a built demo task, or a recipe's prepared data and reward functions.

A demo task is built from data the project ships: the short questions of the bundled Spider subset
(``reward_fns/data/spider/dev_subset.jsonl``), each followed by the same two IFEval instructions in
IFEval's own wording. The instruction-following verifier scores each instruction as its own reward
(``if_c0``, ``if_c1``), so the two rewards' evidence sits on different tokens. Both demo tasks open
with one of three fixed answers ("My answer is yes." ...: ``if_c0``, the first tokens):

- ``if_start_end`` closes with IFEval's end phrase "Is there anything else I can help with?" and
  nothing after it (``if_c1``, the last tokens). SmolLM2-135M-Instruct met the two in 13 and 4 of 48
  answers sampled at temperature 1 with 24 tokens (12 training prompts x 4; 9 and 4 of the 12
  four-answer groups mixed), and in 1 and 0 of the 12 greedy evaluation answers.
- ``if_pair`` asks for a postscript starting with "P.S." (``if_c1``). The model met the two in 5 and
  11 of 48 sampled answers (3 and 8 groups mixed), 0 and 1 of 12 greedy ones. Its postscript check
  passes on any line starting with "P.S.", wherever it sits, and GDPO and MRTPO alike learn it in one
  step at the CPU preset's learning rate.

IFEval's title instruction is not used: greedy answers meet it on every evaluation prompt before any
training. ``python -m benchmarks.learning.base_rates`` measures such rates for a demo task.
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

__all__ = ["DEMO_TASKS", "RECIPE_FAMILIES", "DemoTask", "Task", "build_demo_task", "demo_task", "recipe_task"]

REPO = Path(__file__).resolve().parents[2]
SPIDER_QUESTIONS = REPO / "reward_fns" / "data" / "spider" / "dev_subset.jsonl"

#: An IFEval instruction: its id and arguments.
Constraint = tuple[str, dict[str, str]]
FIXED_ANSWER: Constraint = ("detectable_format:constrained_response", {})


@dataclass(frozen=True)
class DemoTask:
    """A demo task: the instructions appended to every question (reward ``if_c<i>`` scores the i-th)."""

    name: str
    title: str
    constraints: tuple[Constraint, ...]


#: The demo tasks by name: reward ``if_c0`` is about the first tokens of the answer, ``if_c1`` about
#: its last ones.
DEMO_TASKS: dict[str, DemoTask] = {
    task.name: task
    for task in (
        DemoTask(
            "if_start_end",
            "Spider questions + IFEval fixed-answer and end-phrase instructions",
            (FIXED_ANSWER, ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"})),
        ),
        DemoTask(
            "if_pair",
            "Spider questions + IFEval fixed-answer and postscript instructions",
            (FIXED_ANSWER, ("detectable_content:postscript", {"postscript_marker": "P.S."})),
        ),
    )
}


def demo_task(name: str) -> DemoTask:
    """The demo task of that name; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in DEMO_TASKS:
        raise ValueError(f"unknown demo task {name!r}; choose from {list(DEMO_TASKS)}")
    return DEMO_TASKS[name]


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
        from mrtpo_cpu.launch import reward_overrides

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


def demo_prompt(question: str, constraints: Sequence[Constraint]) -> str:
    """The question followed by the instructions' IFEval descriptions."""
    from reward_fns.instruction_following.checkers import check_constraint

    descriptions = [check_constraint(cid, kwargs, "", "x").description for cid, kwargs in constraints]
    return f"{question} {' '.join(descriptions)}"


def demo_split(train_prompts: int, val_prompts: int) -> tuple[list[str], list[str]]:
    """(train, evaluation) questions: the shortest ones; evaluation takes every other one of the first
    ``2 * val_prompts``, so both splits cover the same lengths."""
    questions = spider_questions()
    if len(questions) < train_prompts + val_prompts:
        raise ValueError(
            f"the Spider subset has {len(questions)} distinct questions; {train_prompts} train + {val_prompts} "
            "evaluation prompts asked"
        )
    head = questions[: 2 * val_prompts]
    return (head[0::2] + questions[2 * val_prompts :])[:train_prompts], head[1::2]


def demo_records(questions: Sequence[str], constraints: Sequence[Constraint]) -> list[dict]:
    """IFEval-schema records: each question followed by the instructions' IFEval descriptions."""
    records = []
    for index, question in enumerate(questions):
        prompt = demo_prompt(question, constraints)
        records.append(
            {
                "key": index,
                "prompt": prompt,
                "instruction_id_list": [cid for cid, _ in constraints],
                "kwargs": [dict(kwargs) for _, kwargs in constraints],
            }
        )
    return records


def build_demo_task(out_dir: Path, model_dir: Path, train_prompts: int, val_prompts: int, name: str) -> Task:
    """Write the demo task ``name``'s parquet files under ``out_dir`` (questions from :func:`demo_split`)."""
    chosen = demo_task(name)
    train, val = demo_split(train_prompts, val_prompts)
    source = out_dir / "source"
    source.mkdir(parents=True, exist_ok=True)
    prepared = out_dir / "data"
    changed = False
    for split, items in (("train", train), ("test", val)):
        text = "".join(json.dumps(record) + "\n" for record in demo_records(items, chosen.constraints))
        path = source / f"{split}.jsonl"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed = True
    if changed or not all((prepared / f"{split}.parquet").is_file() for split in ("train", "test")):
        prepare_with_recipe_script(source, prepared, len(chosen.constraints))
    from reward_fns.dispatch import reward_keys

    return finish_task(
        f"{chosen.name} ({chosen.title})",
        prepared / "train.parquet",
        prepared / "test.parquet",
        "instruction_following",
        reward_keys(["instruction_following"], len(chosen.constraints)),
        len(chosen.constraints),
        model_dir,
    )


def prepare_with_recipe_script(source: Path, prepared: Path, max_constraints: int) -> None:
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
            str(max_constraints),
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

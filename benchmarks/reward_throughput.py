"""Rewards per second of each reward family, before and after issue 11's hardening, side by side in one run.

Run from the repository root:

    python -m benchmarks.reward_throughput            # full mixes, about a minute
    python -m benchmarks.reward_throughput --quick    # a few items per mix: a smoke test, not a measurement

*Before* is the family's bare ``compute_score`` (``__wrapped__``, without ``reward_fns.total``'s
totality wrapper) and, for text-to-SQL, ``isolation="inprocess"`` (SQLite's own guards only, in the
calling process). *After* is the ``compute_score`` verl calls: the totality wrapper and, for
text-to-SQL, the sandbox worker pool (``isolation="process"``, the default) with the gold-result
cache in the parent. Both run in this process, one call at a time, interleaved pass by pass
(`benchmarks.machine.time_interleaved`, median of ``--repeats`` passes), so a shared machine's load
hits both alike.

Mixes, all from data that ships with the installed packages:

* text_to_sql / gold: the 643 gold queries of the bundled Spider dev subset as answers;
* text_to_sql / hostile: cheap hostile answers (nesting past the caps, lone surrogate, DML behind a
  CTE, load_extension, oversized blob, unterminated string, 70 kB answer), each refused in milliseconds;
* text_to_sql / deadline-bound: ``printf('%.*c', 2147483647, 'x')`` with a 0.2 s deadline: the
  worker is killed and replaced; in-process the same call runs 12-15 s, so *before* is not run;
* tool_calling / gold: the gold calls of BFCL v4 simple_python and multiple (bfcl-eval wheel);
  hostile: deeply nested JSON, a huge argument, a lone surrogate, an unclosed block;
* instruction_following / prompt-echo: IFEval's prompts (no reference responses ship) echoed back
  as the responses; hostile: the same odd strings as above.

A *before* call that raises is counted (``raised``) and timed like the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.machine import Row, machine_description, time_interleaved
from reward_fns import instruction_following, text_to_sql, tool_calling
from reward_fns.instruction_following.data import load_benchmark
from reward_fns.text_to_sql import BUNDLED_DB_ROOT
from reward_fns.text_to_sql.verifier import clear_gold_cache
from reward_fns.tool_calling.bfcl_data import load_bfcl_category
from reward_fns.tool_calling.reference import gold_calls, parse_ground_truth
from reward_fns.tool_calling.render import render_tool_call_blocks

PRINTF_BOMB_S = 0.2
_ODD_STRINGS = [
    "[" * 5_000 + "]" * 5_000,
    '<tool_call>\n{"name": "f", "arguments": ' + '{"a": ' * 2_000 + "1" + "}" * 2_000 + "}\n</tool_call>",
    '<tool_call>\n{"name": "f", "arguments": {"a": "' + "x" * 100_000 + '"}}\n</tool_call>',
    "caf\ud800e",
    "<tool_call>\n{",
    "",
]


@dataclass(frozen=True)
class Sample:
    """One reward call: compute_score's positional arguments."""

    data_source: str
    response: str
    ground_truth: Any


def _fenced(sql: str) -> str:
    return f"```sql\n{sql}\n```"


def sql_gold(limit: int | None) -> list[Sample]:
    lines = (BUNDLED_DB_ROOT / "dev_subset.jsonl").read_text(encoding="utf-8").splitlines()[:limit]
    examples = [json.loads(line) for line in lines]
    return [Sample("spider", _fenced(e["query"]), {"sql": e["query"], "db_id": e["db_id"]}) for e in examples]


def sql_hostile(limit: int | None) -> list[Sample]:
    ground_truth = {"sql": "SELECT count(*) FROM city", "db_id": "world_1"}
    responses = [
        _fenced("SELECT " + "(" * 46 + "1" + ")" * 46),
        _fenced("SELECT " + "coalesce(" * 50 + "1" + ")" * 50),
        _fenced("SELECT 'a\ud800b'"),
        _fenced("WITH x AS (SELECT 1) DELETE FROM city"),
        _fenced("SELECT load_extension('/nonexistent/evil.so')"),
        _fenced("SELECT zeroblob(2000000)"),
        "```sql\nSELECT 'unterminated\n```",
        "x" * 70_000,
    ]
    return [Sample("spider", response, ground_truth) for response in responses * 8][:limit]


def sql_deadline_bound(limit: int | None) -> list[Sample]:
    ground_truth = {"sql": "SELECT count(*) FROM city", "db_id": "world_1"}
    return [Sample("spider", _fenced("SELECT printf('%.*c', 2147483647, 'x') IS NULL"), ground_truth)] * (limit or 3)


def tool_gold(limit: int | None) -> list[Sample]:
    items = [*load_bfcl_category("simple_python"), *load_bfcl_category("multiple")][:limit]
    return [
        Sample(
            "bfcl", render_tool_call_blocks(gold_calls(parse_ground_truth(item.ground_truth()))), item.ground_truth()
        )
        for item in items
    ]


def tool_hostile(limit: int | None) -> list[Sample]:
    ground_truth = load_bfcl_category("simple_python")[0].ground_truth()
    return [Sample("bfcl", response, ground_truth) for response in _ODD_STRINGS * 8][:limit]


def if_prompts(limit: int | None) -> list[Sample]:
    records = list(load_benchmark("ifeval"))[:limit]
    return [Sample("ifeval", record["prompt"], record) for record in records]


def if_hostile(limit: int | None) -> list[Sample]:
    record = next(iter(load_benchmark("ifeval")))
    return [Sample("ifeval", response, record) for response in _ODD_STRINGS * 8][:limit]


def bare(compute_score: Callable[..., Any]) -> Callable[..., Any]:
    """The family's compute_score without the totality wrapper (functools.wraps keeps it as __wrapped__)."""
    return getattr(compute_score, "__wrapped__", compute_score)


@dataclass
class Pass:
    """One pass over a mix with one scorer; counts the calls that raised."""

    samples: list[Sample]
    scorer: Callable[[Sample], Any]
    raised: int = 0

    def __call__(self) -> None:
        for sample in self.samples:
            try:
                self.scorer(sample)
            except Exception:
                self.raised += 1


def scorers(family: str) -> tuple[Callable[[Sample], Any], Callable[[Sample], Any]]:
    """(before, after) for a family; see the module docstring."""
    if family == "text_to_sql":
        raw = bare(text_to_sql.compute_score)
        return (
            lambda s: raw(s.data_source, s.response, s.ground_truth, isolation="inprocess"),
            lambda s: text_to_sql.compute_score(s.data_source, s.response, s.ground_truth, isolation="process"),
        )
    module = {"tool_calling": tool_calling, "instruction_following": instruction_following}[family]
    raw = bare(module.compute_score)
    return (
        lambda s: raw(s.data_source, s.response, s.ground_truth),
        lambda s: module.compute_score(s.data_source, s.response, s.ground_truth),
    )


def measure(limit: int | None, repeats: int) -> list[Row]:
    mixes: list[tuple[str, str, list[Sample]]] = [
        ("text_to_sql", "gold (Spider dev)", sql_gold(limit)),
        ("text_to_sql", "hostile", sql_hostile(limit)),
        ("tool_calling", "gold (BFCL simple+multiple)", tool_gold(limit)),
        ("tool_calling", "hostile", tool_hostile(limit)),
        ("instruction_following", "prompt echo (IFEval)", if_prompts(limit)),
        ("instruction_following", "hostile", if_hostile(limit)),
    ]
    passes: dict[str, Pass] = {}
    for family, mix, samples in mixes:
        before, after = scorers(family)
        passes[f"{family}|{mix}|before"] = Pass(samples, before)
        passes[f"{family}|{mix}|after"] = Pass(samples, after)
    clear_gold_cache()
    seconds = time_interleaved(dict(passes), repeats)  # the warm-up pass fills the gold cache for both
    rows = []
    for family, mix, samples in mixes:
        before, after = (seconds[f"{family}|{mix}|{side}"] for side in ("before", "after"))
        raised = passes[f"{family}|{mix}|before"].raised
        rows.append(
            Row(
                f"{family} rewards/s",
                f"{mix}, {len(samples)} answers",
                f"{len(samples) / after:,.0f}/s",
                f"{len(samples) / before:,.0f}/s" + (f" ({raised} raised)" if raised else ""),
                "bare compute_score" + (", in-process SQL" if family == "text_to_sql" else ""),
                f"{before / after:.2f}",
            )
        )
    rows.append(deadline_bound_row(limit))
    return rows


def deadline_bound_row(limit: int | None) -> Row:
    """The cost of answers that only the parent's deadline stops (each kills and replaces a worker)."""
    samples = sql_deadline_bound(3 if limit is None else min(limit, 3))
    started = time.perf_counter()
    for sample in samples:
        text_to_sql.compute_score(sample.data_source, sample.response, sample.ground_truth, timeout_s=PRINTF_BOMB_S)
    timed = time.perf_counter() - started
    return Row(
        "text_to_sql rewards/s",
        f"deadline-bound printf bomb, timeout_s={PRINTF_BOMB_S:g}, {len(samples)} answers",
        f"{len(samples) / timed:.2f}/s ({timed / len(samples):.2f} s each)",
        "not run",
        "in-process: 12-15 s each",
        "n/a",
    )


def table_lines(rows: list[Row]) -> list[str]:
    header = Row("measurement", "mix", "after (hardened)", "before", "before is", "after / before")
    fields = list(Row.__dataclass_fields__)
    widths = [max(len(getattr(row, field)) for row in [header, *rows]) for field in fields]

    def line(row: Row) -> str:
        return "| " + " | ".join(getattr(row, f).ljust(w) for f, w in zip(fields, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(row) for row in rows)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few answers per mix: a smoke test, not a measurement")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per mix and side (median reported)")
    args = parser.parse_args(argv)
    limit, repeats = (8, 1) if args.quick else (None, args.repeats)
    shown_argv = sys.argv[1:] if argv is None else argv
    for text in machine_description("benchmarks.reward_throughput", shown_argv, "one reward call at a time; "):
        print(text)
    print()
    for text in table_lines(measure(limit, repeats)):
        print(text, flush=True)


if __name__ == "__main__":
    main()

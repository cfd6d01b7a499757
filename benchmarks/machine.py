"""What every benchmark table shares: the command-and-machine header, the row type and interleaved timing."""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Row:
    """One line of a table: what was measured, ours, the baseline, and ours / baseline."""

    measurement: str
    setting: str
    ours: str
    baseline: str
    baseline_is: str
    ratio: str


def machine_description(module: str, argv: list[str], extra: str = "") -> list[str]:
    """Three lines: the command, the CPU, and torch/Python/threads/load (plus ``extra``, e.g. the model)."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            match = re.search(r"model name\s*:\s*(.+)", cpuinfo.read())
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return [
        f"command: python -m {module} {' '.join(argv)}".rstrip(),
        f"machine: {cpu}; {os.cpu_count()} logical cores; {platform.system()} {platform.machine()}",
        f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}), {torch.get_num_threads()} threads; "
        f"Python {platform.python_version()}; {extra}load average at start {load}",
    ]


def time_interleaved(
    functions: dict[str, Callable[[], object]], repeats: int, warm_up: bool = True
) -> dict[str, float]:
    """Median seconds of each function, calling them in turn in every repeat (shared load hits all alike)."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    for function in functions.values() if warm_up else ():  # warm-up: allocator, thread pool, caches
        function()
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def milliseconds(seconds: float) -> str:
    """``1,234 ms`` from 0.1 s up, ``12.34 ms`` below."""
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.2f} ms"

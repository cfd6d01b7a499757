"""The embedded model's load: converting the GGUF file against reading the converted folder from the cache.

``python -m benchmarks.model_load`` loads the embedded SmolLM2-135M-Instruct three ways in this process, each in a
fresh cache folder of its own where it matters, and prints the CPU seconds of each (``time.process_time``):

- ``convert``: ``load_causal_lm(None)`` on an empty cache (the GGUF conversion, then the folder written);
- ``cached``: ``load_causal_lm(None)`` again (the folder read);
- the conversion's two parts apart (tokenizer, model), straight from the GGUF file.

Writes ``benchmarks/model_load_latest.md`` with the figures and the command.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from mrtpo_verl.replay.embedded_cache import CACHE_DIR_ENV
from mrtpo_verl.replay.model_loading import EMBEDDED_GGUF_FILE, embedded_model_dir, load_causal_lm

LATEST = Path(__file__).resolve().parent / "model_load_latest.md"


def cpu_seconds(action: Callable[[], object]) -> float:
    started = time.process_time()
    action()
    return time.process_time() - started


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(embedded_model_dir()), EMBEDDED_GGUF_FILE
    with tempfile.TemporaryDirectory(prefix="model-load-") as cache:
        os.environ[CACHE_DIR_ENV] = cache
        figures = {
            "convert (empty cache)": cpu_seconds(lambda: load_causal_lm(None)),
            "cached folder": cpu_seconds(lambda: load_causal_lm(None)),
            "GGUF tokenizer alone": cpu_seconds(lambda: AutoTokenizer.from_pretrained(folder, gguf_file=name)),
            "GGUF model alone": cpu_seconds(lambda: AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)),
        }
    lines = [
        "# The embedded model's load: conversion against the cached folder",
        "",
        "`python -m benchmarks.model_load` (CPU seconds of this process, one load each; load average over the last",
        f"minute at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores):",
        "",
        "| load | CPU s |",
        "|---|---|",
        *(f"| {label} | {seconds:.2f} |" for label, seconds in figures.items()),
        "",
        f"Conversion over cached read: {figures['convert (empty cache)'] / figures['cached folder']:.0f}x.",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    LATEST.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

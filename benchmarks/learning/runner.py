"""One (arm, seed) run of verl's trainer, resumable.

Layout of a run folder ``<out>/runs/<arm>/seed<seed>/``:

- ``attempt_<i>/``: one ``python -m mrtpo_verl.main_ppo`` process each (its ``log.txt``, verl's
  file-logger ``metrics.jsonl`` and hydra's outputs); a new attempt after an interruption;
- ``ckpt/``: verl's checkpoints (``trainer.default_local_dir``); every attempt passes
  ``trainer.resume_mode=auto``, so verl resumes from the latest one (weights, optimiser, data-loader
  position, global step) or starts afresh when there is none;
- ``records.jsonl``: the per-step records, written once the run finished: its presence marks the run
  done, and a finished run is never started again. The checkpoints are then deleted (disk).

Metrics of several attempts are merged by step, a later attempt's value winning (steps after the
checkpoint that an interrupted attempt logged are logged again by the resumed one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RunFailed", "attempt_dirs", "merged_metrics", "run_dir", "run_is_done", "run_trainer"]

RECORDS = "records.jsonl"


class RunFailed(RuntimeError):
    """A trainer process ended with an error, ran past its limit, or logged fewer steps than asked."""


def run_dir(root: Path, arm: str, seed: int) -> Path:
    return root / "runs" / arm / f"seed{seed}"


def run_is_done(folder: Path) -> bool:
    return (folder / RECORDS).is_file()


def attempt_dirs(folder: Path) -> list[Path]:
    """The run's attempts, oldest first."""
    return sorted(folder.glob("attempt_*"), key=lambda path: int(path.name.split("_")[1]))


def read_metrics(path: Path) -> dict[int, dict[str, Any]]:
    """verl's file-logger lines ``{"step": s, "data": {...}}`` merged by step; a cut-off last line is skipped."""
    metrics: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return metrics
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a killed process was writing
        metrics.setdefault(int(entry["step"]), {}).update(entry["data"])
    return metrics


def merged_metrics(folder: Path) -> dict[int, dict[str, Any]]:
    """Every attempt's metrics by step, later attempts overriding earlier ones key by key."""
    merged: dict[int, dict[str, Any]] = {}
    for attempt in attempt_dirs(folder):
        for step, data in read_metrics(attempt / "metrics.jsonl").items():
            merged.setdefault(step, {}).update(data)
    return merged


def latest_checkpoint_step(folder: Path) -> int | None:
    """verl's ``latest_checkpointed_iteration.txt`` under ``ckpt/`` (None: no checkpoint yet)."""
    marker = folder / "ckpt" / "latest_checkpointed_iteration.txt"
    if not marker.is_file():
        return None
    return int(marker.read_text().strip())


def run_trainer(
    folder: Path,
    overrides: Sequence[str],
    env: Mapping[str, str],
    steps: int,
    timeout_s: float,
    log: Any = print,
) -> dict[int, dict[str, Any]]:
    """Run (or resume) one trainer run in ``folder`` until its ``steps`` steps are logged.

    Returns the merged metrics by step. Raises :class:`RunFailed` with the log's tail when the
    process fails, runs past ``timeout_s`` (it is killed: a hang stops the comparison, never blocks
    it), or ends with steps missing.
    """
    folder.mkdir(parents=True, exist_ok=True)
    attempt = folder / f"attempt_{len(attempt_dirs(folder))}"
    attempt.mkdir()
    resumed_from = latest_checkpoint_step(folder)
    if resumed_from is not None:
        log(f"    resuming from verl's checkpoint at step {resumed_from}")
    command = [
        sys.executable,
        "-m",
        "mrtpo_verl.main_ppo",
        *overrides,
        f"trainer.default_local_dir={folder / 'ckpt'}",
        "trainer.resume_mode=auto",
    ]
    (attempt / "command.json").write_text(json.dumps(command, indent=1))
    full_env = {**os.environ, **env, "VERL_FILE_LOGGER_PATH": str(attempt / "metrics.jsonl")}
    started = time.monotonic()
    with (attempt / "log.txt").open("w") as handle:
        # Its own session, so that a timeout ends the trainer and the Ray processes it started.
        process = subprocess.Popen(
            command, env=full_env, cwd=attempt, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            raise RunFailed(f"{folder}: no result within {timeout_s:.0f} s; log: {attempt / 'log.txt'}") from None
        except BaseException:
            os.killpg(process.pid, 9)  # Ctrl-C: leave no trainer behind; the run resumes next time
            process.wait()
            raise
    tail = (attempt / "log.txt").read_text(errors="replace")[-4000:]
    if returncode != 0:
        raise RunFailed(f"{folder}: trainer exited with status {returncode}; log {attempt / 'log.txt'} ends:\n{tail}")
    metrics = merged_metrics(folder)
    missing = [step for step in range(1, steps + 1) if step not in metrics]
    if missing:
        raise RunFailed(f"{folder}: steps {missing} were not logged; log {attempt / 'log.txt'} ends:\n{tail}")
    log(f"    finished in {time.monotonic() - started:.0f} s")
    return metrics


def finish_run(folder: Path, records: Sequence[Mapping[str, Any]], keep_checkpoints: bool = False) -> None:
    """Write ``records.jsonl`` (atomically: it marks the run done) and drop the checkpoints."""
    temporary = folder / (RECORDS + ".tmp")
    temporary.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    temporary.replace(folder / RECORDS)
    if not keep_checkpoints:
        shutil.rmtree(folder / "ckpt", ignore_errors=True)


def read_records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / RECORDS).read_text(encoding="utf-8").splitlines() if line]

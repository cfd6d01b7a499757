"""Smoke test of benchmarks/driver_memory.py: ``--quick`` runs the driver's relevance path and prints every row.

The path is the real one (the collect registered on the replay worker's method, dispatch_balanced, the replay stage,
the estimator through verl's compute_advantage) on a small synthetic batch; the figures of a quick run are not
measurements and are not checked.
"""

from __future__ import annotations

import pytest

from benchmarks.driver_memory import STAGES, main


def test_quick_run_prints_every_stage_for_both_allocators(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "command: python -m benchmarks.driver_memory --quick"
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| stage")]
    labels = [row.split("|")[1].strip() for row in rows]
    for stage in STAGES:
        assert f"{stage}: peak over the path's start" in labels
    assert "**whole path** (max of the stages)" in labels
    assert any(label.startswith("verl's gdpo estimator") for label in labels)
    for row in rows:
        cells = [cell.strip() for cell in row.split("|")[2:-1]]
        assert len(cells) == 4 and all(cell.endswith(("MiB", "×")) for cell in cells), row

"""Smoke test of benchmarks/replay_collectives.py: ``--quick`` runs verl's actor worker on 2 gloo ranks and prints
the counts of one replay step and of verl's old-log-prob pass on a small real text-to-SQL batch.

The figures of a quick run are not the benchmark's; what is checked is that every count was taken (each side ran
forward calls of the root and FSDP parameter all-gathers on every rank) and the ratio row is printed.
"""

from __future__ import annotations

import pytest

from benchmarks.replay_collectives import HEADER, main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_quick_run_counts_both_passes_on_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "command: python -m benchmarks.replay_collectives --quick"
    assert HEADER in lines
    rows = [line for line in lines if line.startswith("| 2 | text_to_sql |")]
    assert len(rows) == 1, lines
    cells = [cell.strip() for cell in rows[0].split("|")[1:-1]]
    replay_gathers, replay_forwards, _, meetings, verl_gathers, verl_forwards = cells[3:9]
    for per_rank in (replay_gathers, replay_forwards, meetings, verl_gathers, verl_forwards):
        counts = [int(value) for value in per_rank.split("/")]
        assert len(counts) == 2 and min(counts) > 0, rows[0]
    assert cells[9].startswith("**") and cells[9].endswith("×**")

"""Smoke test of benchmarks/reward_throughput.py: ``--quick`` fills every table for every family.

It runs verl's real naive reward-loop manager with SmolLM2's tokenizer and the real worker pools;
the figures of a quick run are not measurements, but the fairness rows' counts are checked: every
deadline-bound answer is marked as a timeout and no gold answer's score changes in the mixed batch.
"""

from __future__ import annotations

import re

import pytest

from benchmarks.reward_throughput import FAMILIES, main
from reward_fns.process_pool.pool import close_shared_pool


def table(lines: list[str], marker: str) -> list[list[str]]:
    rows = [line for line in lines if line.startswith("| ") and marker in line]
    assert len({len(line) for line in rows}) == 1, rows  # one aligned table
    return [[cell.strip() for cell in line.split("|")[1:-1]] for line in rows]


def test_quick_run_prints_every_table(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["--quick"])
    finally:
        close_shared_pool()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "command: python -m benchmarks.reward_throughput --quick"

    gold = table(lines, "rewards/s")
    assert [row[0] for row in gold] == [f"{family} rewards/s" for family in FAMILIES]
    for row in gold:
        rates = [float(rate.replace(",", "")) for rate in re.findall(r"([\d,.]+)/s", row[2] + row[3])]
        assert len(rates) == 2 and all(rate > 0 for rate in rates), row

    fairness = table(lines, "fairness")
    assert [row[0] for row in fairness] == [f"{family} fairness" for family in FAMILIES]
    for row in fairness:
        assert "2/2 timeouts, 0 gold scores changed" in row[2], row
        assert float(row[2].split(" s;")[0]) > 0 and float(row[3].rstrip(" s")) > 0

    worst = table(lines, "| instruction_following worst case")
    assert len(worst) == 3
    assert all(float(row[2].split(" s")[0]) < 6.0 for row in worst)

    in_thread = table(lines, "in-thread worst case")
    assert len(in_thread) == 4  # three instruction ids, then the three in one prompt
    assert all(0.0 < float(row[2].split(" ms")[0]) < 1000.0 for row in in_thread)

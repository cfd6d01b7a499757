"""Smoke test of benchmarks/reward_throughput.py: ``--quick`` runs every mix of every family and prints a full table."""

from __future__ import annotations

import re

import pytest

from benchmarks.reward_throughput import main
from reward_fns.process_pool.pool import close_shared_pool


def test_quick_run_prints_a_rate_for_every_family_and_mix(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        main(["--quick"])
    finally:
        close_shared_pool()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "command: python -m benchmarks.reward_throughput --quick"
    table = [line for line in lines if line.startswith("| ") and "rewards/s" in line]
    assert len({len(line) for line in table}) == 1
    mixes = [(cells[1].strip(), cells[2].split(",")[0].strip()) for cells in (line.split("|") for line in table)]
    assert mixes == [
        ("text_to_sql rewards/s", "gold (Spider dev)"),
        ("text_to_sql rewards/s", "hostile"),
        ("tool_calling rewards/s", "gold (BFCL simple+multiple)"),
        ("tool_calling rewards/s", "hostile"),
        ("instruction_following rewards/s", "prompt echo (IFEval)"),
        ("instruction_following rewards/s", "hostile"),
        ("text_to_sql rewards/s", "deadline-bound printf bomb"),
    ]
    for line in table:
        rates = [float(rate.replace(",", "")) for rate in re.findall(r"([\d,.]+)/s", line)]
        assert rates and all(rate > 0 for rate in rates), line
    # A printf bomb costs its 0.2 s deadline plus the kill, never the 12-15 s it runs in-process.
    (seconds_each,) = re.findall(r"\(([\d.]+) s each\)", table[-1])
    assert 0.2 <= float(seconds_each) <= 0.7

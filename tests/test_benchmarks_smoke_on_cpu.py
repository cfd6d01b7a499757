"""Smoke test of benchmarks/replay_cost.py's model-free helpers (the timings themselves need minutes)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.replay_cost import Row, fit_row, line_fit, parse_setting, synthetic_items, table_lines


def test_line_fit_recovers_a_line_and_flags_a_super_linear_tail() -> None:
    intercept, slope, r2 = line_fit([1.0, 2.0, 4.0, 8.0], [1.5, 2.0, 3.0, 5.0])
    assert intercept == pytest.approx(1.0) and slope == pytest.approx(0.5) and r2 == pytest.approx(1.0)
    assert "linear" in fit_row("fit", [1, 2, 4], [1.0, 2.0, 4.0], "s").ratio
    assert "super-linear" in fit_row("fit", [1, 2, 4], [1.0, 2.0, 8.0], "s").ratio


def test_settings_items_and_table() -> None:
    assert parse_setting("4x128+256") == (4, 128, 256)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_setting("4x128")
    items = synthetic_items(batch=2, prompt_length=20, response_length=5, num_rewards=3, seed=0)
    assert all(len(c) == 20 and c != item.full_context_ids for item in items for c in item.leave_one_out_ids)
    lines = table_lines([Row("a", "b", "c", "d", "e", "f")])
    assert len(lines) == 3 and len({len(line) for line in lines}) == 1

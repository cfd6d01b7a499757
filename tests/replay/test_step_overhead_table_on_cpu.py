"""``benchmarks.step_overhead`` without a trainer: its arguments, steady-state medians and table.

The real runs (verl's trainer, minutes each) are the benchmark's own job; here the metrics are
hand-written dicts in the layout verl's file logger writes (``{step: {name: value}}``).
"""

from __future__ import annotations

import pytest

from benchmarks.step_overhead import parse_args, summarise, table


def test_quick_mode_and_bad_arguments() -> None:
    quick = parse_args(["--quick"])
    assert (quick.prompts, quick.n, quick.response_length, quick.steps) == (2, 4, 16, 2)
    with pytest.raises(SystemExit):
        parse_args(["--steps", "1"])  # no steady-state step left after the warm-up one
    with pytest.raises(SystemExit):
        parse_args(["--prompts", "0"])


def test_first_step_is_kept_out_of_the_steady_state_medians() -> None:
    gdpo = [{1: {"timing_s/step": 50.0}, 2: {"timing_s/step": 10.0}, 3: {"timing_s/step": 12.0}}]
    mrtpo = [
        {
            1: {"timing_s/step": 90.0, "mrtpo/replay/time_s": 40.0},
            2: {"timing_s/step": 15.0, "mrtpo/replay/time_s": 3.0, "mrtpo/replay/tokens_replayed": 800},
            3: {"timing_s/step": 17.0, "mrtpo/replay/time_s": 5.0, "mrtpo/replay/tokens_replayed": 1000},
        }
    ]
    base, ours = summarise("gdpo", gdpo), summarise("mrtpo shared", mrtpo)
    assert (base.first_step_s, base.step_s, base.replay_s) == (50.0, 11.0, 0.0)
    assert (ours.first_step_s, ours.step_s, ours.replay_s, ours.replayed_tokens) == (90.0, 16.0, 4.0, 900.0)
    assert ours.replay_share == pytest.approx(0.25)
    lines = table([base, ours])
    assert lines[2].endswith("| 1.00x |")
    assert "| 25% |" in lines[3] and lines[3].endswith(f"| {16.0 / 11.0:.2f}x |")


def test_a_run_with_only_its_warm_up_step_is_refused() -> None:
    with pytest.raises(ValueError, match="no step after the first"):
        summarise("gdpo", [{1: {"timing_s/step": 5.0}}])

"""The JS benchmarks still run: the CPU benchmark (--quick) prints its one table; the GPU check refuses politely."""

import sys

import pytest

from benchmarks import gpu_check, js_relevance


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak-RSS measurement reads /proc")
def test_cpu_benchmark_quick_run_prints_one_table(capsys: pytest.CaptureFixture[str]) -> None:
    js_relevance.main(["--quick"])
    out = capsys.readouterr().out
    assert out.startswith("command: python -m benchmarks.js_relevance --quick\nmachine: ")
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "measurement"
    kinds = [line.split("|")[1].strip() for line in table[2:]]
    assert kinds == ["speed"] * 6 + ["peak extra memory"] * 2 + ["one-to-many"] * 2
    assert all(line.split("|")[-2].strip() not in {"", "nan"} for line in table[2:])


def test_gpu_check_without_a_gpu_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The plain command on a machine without CUDA (here: every CI machine) names why and checks nothing."""
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err

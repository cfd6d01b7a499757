"""The main job end to end (small settings), the render CLI on run dumps, and the page in headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.credit import render
from mrtpo_verl.credit.views import read_views
from mrtpo_verl.demo import __main__ as demo
from mrtpo_verl.trainer.credit_dump import dump_step
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch, smollm2

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    code = demo.main(
        ["--tasks", "text_to_sql", "tool_calling", "--samples", "2", "--max-new-tokens", "8", "--out", str(out)]
    )
    assert code == 0
    return out


def test_demo_writes_summary_views_and_page(demo_out: Path) -> None:
    summary = json.loads((demo_out / "summary.json").read_text())
    assert set(summary["tasks"]) == {"text_to_sql", "tool_calling"}
    assert summary["tasks"]["text_to_sql"]["responses"] == 3  # 2 samples + the labelled reference answer
    assert summary["replay"]["forward_passes"] > 0 and summary["replay"]["time_s"] > 0
    meta, views = read_views(demo_out / "views.jsonl")
    assert meta["β_s"] == 0.5 and len(views) == 6
    for view in views:
        assert len(view.tokens) == len(view.gdpo_total) == len(view.mrtpo_total)
        assert set(view.rewards) == set(view.gdpo_by_reward) == set(view.mrtpo_by_reward)
        # Each reward's credit keeps its total per response; MRTPO moves it along the response.
        for key in view.gdpo_by_reward:
            assert sum(view.mrtpo_by_reward[key]) == pytest.approx(sum(view.gdpo_by_reward[key]), abs=1e-4)
    page = (demo_out / "token_credit.html").read_text()
    assert "Legend" in page and "GDPO" in page and "MRTPO" in page
    assert "reference answer (added, not sampled)" in page


def test_render_cli_on_a_runs_step_dumps(tmp_path: Path) -> None:
    data = real_sql_batch()
    model, tokenizer = smollm2()
    cfg = MRTPOConfig(reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=4))
    relevance, _ = ReplayStage(cfg, None, InProcessBackend(cfg, model, tokenizer)).run(data, global_step=4)
    for step in (4, 5):
        dump_step(str(tmp_path / "dumps"), data, relevance, cfg, step, tokenizer)
    out = tmp_path / "page.html"
    assert render.main([str(tmp_path / "dumps"), "--steps", "5", "--out", str(out)]) == 0
    page = out.read_text()
    assert "step 5" in page and "step 4" not in page
    # Every token of every response is drawn once per row (total + each reward) and column (GDPO, MRTPO).
    _, views = read_views(tmp_path / "dumps" / "step_5.jsonl")
    expected_spans = sum(len(v.tokens) * 2 * (1 + len(v.gdpo_by_reward)) for v in views)
    assert page.count('class="tok"') == expected_spans
    assert ">SELECT<" in page or "> SELECT<" in page
    with pytest.raises(SystemExit):
        render.main([str(tmp_path / "dumps"), "--steps", "9", "--out", str(out)])
    # The command's first name still works, as a process (the alias runs the same main).
    alias_out = tmp_path / "alias.html"
    command = [sys.executable, "-m", "mrtpo_verl.demo.render", str(tmp_path / "dumps"), "--steps", "5"]
    subprocess.run([*command, "--out", str(alias_out)], check=True, capture_output=True, timeout=120)
    assert alias_out.read_text() == page


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (make test installs it)")
def test_page_renders_tokens_and_legend_in_headless_chromium(demo_out: Path, tmp_path: Path) -> None:
    page = demo_out / "token_credit.html"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert "Legend" in dom and dom.count('class="tok"') > 20
    screenshot = tmp_path / "page.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={screenshot}", "--window-size=1200,1600", page.as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert screenshot.stat().st_size > 10_000  # a rendered page, not a blank one

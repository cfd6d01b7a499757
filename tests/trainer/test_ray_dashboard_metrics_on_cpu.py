"""MRTPO's figures reach the Ray dashboard: a real replay worker group exports them with ray.util.metrics,
and the node's Prometheus endpoint (the one the dashboard and Grafana read) serves them."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
import ray

from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.ray_metrics import gauge_name_and_tags
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import DedicatedBackend, create_replay_worker_group
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_until(port: int, wanted: list[str], timeout_s: float = 90.0) -> str:
    """Poll the metrics endpoint until every wanted series name appears (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    body = ""
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            body = response.read().decode()
        if all(name in body for name in wanted):
            return body
        time.sleep(1.0)
    missing = [name for name in wanted if name not in body]
    raise AssertionError(f"metrics endpoint never showed {missing}")


def test_gauge_names() -> None:
    assert gauge_name_and_tags("mrtpo/replay/tokens_per_s") == ("mrtpo_replay_tokens_per_s", {})
    assert gauge_name_and_tags("mrtpo/sql_format/relevance_top10_share") == (
        "mrtpo_relevance_top10_share",
        {"reward": "sql_format"},
    )


def test_replay_workers_export_their_figures() -> None:
    port = free_port()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 500},
    )
    try:
        cfg = MRTPOConfig(
            reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=4)
        )
        group = create_replay_worker_group(cfg, None, [1], "cpu", cpus_per_worker=2)
        _, metrics = ReplayStage(cfg, None, DedicatedBackend(group)).run(real_sql_batch(), global_step=1)
        body = scrape_until(
            port,
            [
                "ray_mrtpo_replay_tokens_per_s",
                "ray_mrtpo_relevance_top10_share",
                "ray_mrtpo_replay_skip_fraction",
                "ray_mrtpo_relevance_mean",
            ],
        )
    finally:
        ray.shutdown()
    worker_lines = [line for line in body.splitlines() if 'role="mrtpo_replay_rank0"' in line]
    shares = {
        line.split('reward="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in worker_lines
        if line.startswith("ray_mrtpo_relevance_top10_share")
    }
    assert set(shares) == set(REWARD_KEYS)
    for key in REWARD_KEYS:
        # The worker's figure is the one the driver logs to verl's tracking (one worker: the same shard).
        assert shares[key] == pytest.approx(metrics[f"mrtpo/{key}/relevance_top10_share"], rel=1e-6)
    assert any(line.startswith("ray_mrtpo_replay_time_s") and 'role="driver"' in line for line in body.splitlines())

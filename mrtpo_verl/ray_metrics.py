"""Export MRTPO's per-step figures with ``ray.util.metrics`` so they appear on the Ray dashboard.

verl's tracking (console, wandb, tensorboard …) gets the same figures from the trainer's metrics
dict; this module mirrors them into Prometheus gauges served by each Ray node's metrics agent
(``ray start --metrics-export-port=...`` or ``ray.init(_metrics_export_port=...)``), which the Ray
dashboard's metrics view and Grafana read.

A metric name ``mrtpo/<reward>/relevance_mean`` becomes the gauge ``mrtpo_relevance_mean`` with
the tag ``reward=<reward>``; ``reward/<reward>/mean`` (the training reward components) becomes
``mrtpo_reward_mean`` with the same tag; ``mrtpo/replay/time_s`` becomes ``mrtpo_replay_time_s``. Every gauge
also carries ``role`` (``driver`` or the replay worker group's name).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping

__all__ = ["gauge_name_and_tags", "publish"]

_GAUGES: dict[str, object] = {}
_LOCK = threading.Lock()
_SAFE = re.compile(r"[^a-zA-Z0-9_]")
#: Second path segments that are sections, not reward keys.
_SECTIONS = {"replay", "staleness"}


def gauge_name_and_tags(metric: str) -> tuple[str, dict[str, str]]:
    """``mrtpo/<reward>/<figure>`` → (``mrtpo_<figure>``, {reward}); ``mrtpo/replay/<x>`` → ``mrtpo_replay_<x>``;
    ``reward/<reward>/<stat>`` → (``mrtpo_reward_<stat>``, {reward})."""
    parts = metric.split("/")
    if len(parts) == 3 and parts[0] == "reward":
        return _SAFE.sub("_", f"mrtpo_reward_{parts[2]}"), {"reward": parts[1]}
    if len(parts) == 3 and parts[0] == "mrtpo" and parts[1] not in _SECTIONS:
        return _SAFE.sub("_", f"mrtpo_{parts[2]}"), {"reward": parts[1]}
    return _SAFE.sub("_", "_".join(parts)), {}


def publish(metrics: Mapping[str, float], role: str) -> None:
    """Set one gauge per ``mrtpo/...`` or ``reward/...`` figure (others are ignored); a no-op outside a Ray process."""
    import ray

    if not ray.is_initialized():
        return
    from ray.util.metrics import Gauge

    for metric, value in metrics.items():
        if not metric.startswith(("mrtpo/", "reward/")):
            continue
        name, tags = gauge_name_and_tags(metric)
        with _LOCK:
            gauge = _GAUGES.get(name)
            if gauge is None:
                gauge = Gauge(name, description=f"MRTPO {name} (see mrtpo_verl.metrics)", tag_keys=("role", "reward"))
                _GAUGES[name] = gauge
        gauge.set(float(value), tags={"role": role, "reward": tags.get("reward", "")})  # type: ignore[attr-defined]

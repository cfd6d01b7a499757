"""Tear-down of a verl worker group inside a test's Ray cluster, so the next group can be placed."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import ray


def release(group: Any, timeout_s: float = 60.0) -> None:
    """Kill the group's actors, remove its placement groups, and wait until Ray counts their resources free.

    Ray frees a removed placement group's resources asynchronously; a group created right after would
    otherwise find them still taken.
    """
    placement_groups = list(getattr(group.resource_pool, "pgs", None) or [])
    held: Counter[str] = Counter()
    for placement_group in placement_groups:
        for bundle in placement_group.bundle_specs:
            held.update({key: value for key, value in bundle.items() if key in ("CPU", "GPU")})
    before = ray.available_resources()
    for handle in group.workers:
        ray.kill(handle)
    for placement_group in placement_groups:
        ray.util.remove_placement_group(placement_group)
    deadline = time.monotonic() + timeout_s
    while any(ray.available_resources().get(key, 0.0) < before.get(key, 0.0) + amount for key, amount in held.items()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray did not free {dict(held)} within {timeout_s} s of removing the placement groups")
        time.sleep(0.2)

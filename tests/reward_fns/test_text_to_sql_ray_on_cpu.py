"""The SQL sandbox inside a Ray actor that scores from several threads, as verl's reward workers do."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray

from reward_fns.text_to_sql import BUNDLED_DB_ROOT

GOLD = {"sql": "SELECT count(*) FROM singer", "db_id": "concert_singer"}
RESPONSES = {
    "gold": "```sql\nSELECT count(*) FROM singer\n```",
    "printf-bomb": "```sql\nSELECT printf('%.*c', 2147483647, 'x') IS NULL\n```",
    "nested": "```sql\nSELECT " + "(" * 46 + "1" + ")" * 46 + "\n```",
    "lone-surrogate": "```sql\nSELECT '\ud800'\n```",
}


@ray.remote(num_cpus=0)
class ThreadedRewardWorker:
    """Scores a batch from a thread pool, like a reward worker that overlaps its calls."""

    def score(self, names: list[str]) -> tuple[list[dict[str, Any]], list[int]]:
        from concurrent.futures import ThreadPoolExecutor

        from reward_fns.process_pool.pool import shared_pool
        from reward_fns.text_to_sql import compute_score
        from reward_fns.text_to_sql.isolation import TASKS_MODULE

        def one(name: str) -> dict[str, Any]:
            return compute_score("spider", RESPONSES[name], GOLD, timeout_s=1.0)

        with ThreadPoolExecutor(max_workers=4) as threads:
            results = list(threads.map(one, names))
        return results, shared_pool(TASKS_MODULE).worker_pids()


def process_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def test_threaded_ray_actor_scores_hostile_batches_and_its_workers_go_with_it() -> None:
    assert (BUNDLED_DB_ROOT / "concert_singer.sqlite").is_file()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        actor = ThreadedRewardWorker.remote()  # type: ignore[attr-defined]
        names = ["gold", "printf-bomb", "nested", "gold", "lone-surrogate", "printf-bomb", "gold", "gold"]
        started = time.monotonic()
        results, pids = ray.get(actor.score.remote(names), timeout=120)
        # Two deadline-bound answers, four threads each with a worker of its own: about 1.2 s in all.
        assert time.monotonic() - started < 30
        assert [result["score"] for result in results] == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
        assert "was killed" in str(results[1]["sql_executability_info"])
        assert 1 <= len(pids) <= 4  # workers are forked on demand: at most one per thread
        ray.kill(actor)  # no atexit, no close(): the workers must notice on their own
    finally:
        if started_ray:
            ray.shutdown()
    give_up = time.monotonic() + 15.0
    while not all(process_gone(pid) for pid in pids) and time.monotonic() < give_up:
        time.sleep(0.1)
    assert all(process_gone(pid) for pid in pids)

"""The offline Punkt model: one shared, content-addressed copy; nothing left in the temporary folder.

Every process that loads the instruction-following checkers needs the Punkt model as files. They all
share one directory in the user's cache, so processes that exit, and reward workers that are killed
(where ``atexit`` never runs), leave nothing in the temporary folder. Each process here runs with
``TMPDIR`` set to an empty folder made by the test and ``XDG_CACHE_HOME`` set to another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import ray

from reward_fns.instruction_following.offline_nltk import _punkt_tab_files, _shared_data_root

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 3

#: Scores one real IFEval prompt whose check counts sentences (NLTK Punkt), prints what the process saw.
SCORE_ONE_PROMPT = textwrap.dedent(
    """
    import json, tempfile
    import nltk
    from reward_fns.instruction_following import compute_score
    from reward_fns.instruction_following.data import load_benchmark

    record = next(
        r for r in load_benchmark("ifeval") if r["instruction_id_list"] == ["length_constraints:number_sentences"]
    )
    # In this process (not the family's worker pool), so that nltk.data.path below is the checker's own.
    response = "Dr. Smith left at 5 p.m. today. He was tired. Then he slept."
    scores = compute_score("ifeval", response, record, isolation="inprocess")
    print(json.dumps({"data_root": nltk.data.path[0], "tmp": tempfile.gettempdir(), "score": scores["if_c0"]}))
    """
)


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """(an empty temporary folder for the processes, their cache home)."""
    (tmp_path / "tmp").mkdir()
    (tmp_path / "cache").mkdir()
    return tmp_path / "tmp", tmp_path / "cache"


def shared_roots(cache: Path) -> list[Path]:
    return sorted((cache / "mrtpo-verl" / "nltk_data").iterdir())


def test_concurrent_first_writers_leave_one_complete_copy(tmp_path: Path) -> None:
    """Eight threads race to create the directory (no lock between them): one copy, no staging left."""
    files = _punkt_tab_files()
    barrier = threading.Barrier(8)
    roots: list[Path] = []

    def create() -> None:
        barrier.wait()
        roots.append(_shared_data_root(tmp_path, files))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(roots) == 8 and len(set(roots)) == 1
    assert sorted(tmp_path.iterdir()) == roots[:1]  # no staging directory left behind
    model_dir = roots[0] / "tokenizers" / "punkt_tab" / "english"
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == {k: v.encode() for k, v in files.items()}


def test_a_changed_shared_copy_is_refused_by_name(tmp_path: Path) -> None:
    files = _punkt_tab_files()
    root = _shared_data_root(tmp_path, files)
    (root / "tokenizers" / "punkt_tab" / "english" / "abbrev_types.txt").write_text("p.m\n")
    with pytest.raises(RuntimeError, match=r"abbrev_types\.txt is missing or differs.*delete"):
        _shared_data_root(tmp_path, files)


def test_processes_and_a_killed_ray_worker_leave_nothing_in_the_temporary_folder(
    folders: tuple[Path, Path],
) -> None:
    tmp, cache = folders
    env = {**os.environ, "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(cache)}
    # Several processes at once: they also race to create the shared copy.
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", SCORE_ONE_PROMPT],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(PROCESSES)
    ]
    seen = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=180)
        assert run.returncode == 0, stderr.decode()[-3000:]
        seen.append(json.loads(stdout.decode().strip().splitlines()[-1]))

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        class RewardWorker:
            def score(self) -> dict:
                namespace: dict = {}
                exec(SCORE_ONE_PROMPT.replace("print(json.dumps(", "result = (("), namespace)
                return namespace["result"]

        worker = RewardWorker.options(
            runtime_env={"env_vars": {"TMPDIR": str(tmp), "XDG_CACHE_HOME": str(cache)}}
        ).remote()
        seen.append(ray.get(worker.score.remote(), timeout=180))
        ray.kill(worker)  # no atexit, no clean-up of any kind in the worker
    finally:
        if started_ray:
            ray.shutdown()

    assert sorted(p.name for p in tmp.iterdir()) == []  # nothing left in the temporary folder
    roots = shared_roots(cache)
    assert len(roots) == 1 and roots[0].name.startswith("punkt_tab-")  # one copy, reused by all four
    assert all(s["data_root"] == str(roots[0]) for s in seen), seen
    assert all(s["tmp"] == str(tmp) for s in seen), seen  # the temporary folder under test was theirs
    assert len({s["score"] for s in seen}) == 1  # the same verdict everywhere

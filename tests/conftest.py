"""Shared builders for tests: real verl DataProto batches with grouped responses."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from verl import DataProto

from mrtpo_verl.replay.embedded_cache import CACHE_DIR_ENV
from tests.support.temp_files import checkpoint_locks, remove_unheld_locks

#: The session's model-cache folder, whether this process made it, and the variable's value before the session.
_SESSION_CACHE = pytest.StashKey[tuple[str, bool, "str | None"]]()
#: Set by the process that made the session's cache folder; ``make test``'s pytest workers inherit it and reuse the
#: folder instead of converting the model once more each.
_SESSION_CACHE_OWNER = "MRTPO_TEST_SESSION_CACHE"


def pytest_configure(config: pytest.Config) -> None:
    """The session's environment, set before any test starts a process (every subprocess and Ray worker inherits it).

    - Its own model cache: the embedded model is converted once per session (shared by the pytest workers), and
      the user's cache is neither read nor written.
    - In a ``make test`` worker, one torch thread (see below).
    - ``RAY_ADDRESS=local``: a ``ray.init()`` without an address starts a cluster of its own, as the tests mean,
      instead of joining one that a test beside it started with ``ray start`` (Ray reads
      ``/tmp/ray/ray_current_cluster``) and then refusing its own ``num_cpus``.
    """
    inherited = os.environ.get(_SESSION_CACHE_OWNER)
    previous = os.environ.get(CACHE_DIR_ENV)
    if inherited:
        folder, owner = inherited, False
    else:
        folder, owner = tempfile.mkdtemp(prefix="mrtpo-test-cache-"), True
        os.environ[_SESSION_CACHE_OWNER] = folder
    config.stash[_SESSION_CACHE] = (folder, owner, previous)
    os.environ[CACHE_DIR_ENV] = folder
    os.environ.setdefault("RAY_ADDRESS", "local")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two workers share two cores: one thread each (and in what they start), or OpenMP threads wait on each
        # other's barriers.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, owner, previous = config.stash[_SESSION_CACHE]
    if owner:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(_SESSION_CACHE_OWNER, None)
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


#: Test modules that take minutes (whole verl trainer runs, Ray worker groups, long-context replays), longest first
#: as ``pytest --durations=0`` measured them on 2 cores. ``make test`` gives whole modules to two workers in
#: collection order (``--dist loadfile --no-loadscope-reorder``), so these go first and the short ones fill in
#: behind them: both workers then finish together. A module not listed runs in its usual order, after these.
LONGEST_MODULES_FIRST = (
    "tests/cpu_run/test_async_trainer_on_cpu.py",
    "tests/test_learning_smoke_on_cpu.py",
    "tests/cpu_run/test_verl_trainer_on_cpu.py",
    "tests/cpu_run/test_separate_async_trainer_on_cpu.py",
    "tests/replay/test_prefix_sharing_on_cpu.py",
    "tests/replay/test_long_context_compute_on_cpu.py",
    "tests/test_cli_mistakes_on_cpu.py",
    "tests/recipes/test_recipes_dry_run_on_cpu.py",
    "tests/trainer/test_colocated_engine_options_on_cpu.py",
    "tests/trainer/test_replay_audit_on_cpu.py",
    "tests/trainer/test_two_node_replay_on_cpu.py",
    "tests/replay/test_float32_compute_on_cpu.py",
    "tests/trainer/test_multi_turn_advantage_step_on_cpu.py",
    "tests/replay/test_replay_numerics_on_cpu.py",
    "tests/trainer/test_colocated_replay_on_cpu.py",
    "tests/test_plugin_on_cpu.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the modules of :data:`LONGEST_MODULES_FIRST` first, in that order; every module's tests stay together
    and in their own order (a stable sort on the module's rank)."""
    rank = {path: index for index, path in enumerate(LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def make_grouped_batch(
    seed: int,
    n_groups: int = 3,
    group_size: int = 4,
    response_length: int = 9,
    reward_keys: tuple[str, ...] = ("format", "correct"),
    prompt_length: int = 5,
    with_relevance: bool = True,
) -> DataProto:
    """A DataProto shaped like verl's after rewards: masks, uid groups, one numeric array per reward.

    Rewards are small integers (as binary/graded verifiers give), so some groups are constant in
    some reward (zero advantage), which is the common case exact skipping exploits.
    """
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    batch_size = n_groups * group_size
    lengths = torch.randint(1, response_length + 1, (batch_size,), generator=generator)
    response_mask = (torch.arange(response_length)[None, :] < lengths[:, None]).long()
    attention_mask = torch.cat([torch.ones(batch_size, prompt_length, dtype=torch.long), response_mask], dim=1)
    tensors = {
        "prompts": torch.randint(0, 100, (batch_size, prompt_length), generator=generator),
        "responses": torch.randint(0, 100, (batch_size, response_length), generator=generator),
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        "token_level_rewards": torch.zeros(batch_size, response_length),
    }
    if with_relevance:
        tensors["mrtpo_relevance"] = torch.rand(batch_size, len(reward_keys), response_length, generator=generator)
    non_tensors: dict[str, np.ndarray] = {
        "uid": np.array([f"prompt-{i // group_size}" for i in range(batch_size)], dtype=object),
    }
    for key in reward_keys:
        non_tensors[key] = rng.integers(0, 3, batch_size).astype(np.float64)
        non_tensors[f"{key}_info"] = np.array([f"what {key} checks" for _ in range(batch_size)], dtype=object)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


@pytest.fixture
def grouped_batch() -> DataProto:
    return make_grouped_batch(seed=0)


@pytest.fixture(scope="session", autouse=True)
def remove_verl_checkpoint_locks() -> Iterator[None]:
    """The ``ckpt_*.lock`` files verl leaves in the temporary folder during this session are removed at its end."""
    before = checkpoint_locks()
    yield
    remove_unheld_locks(checkpoint_locks() - before)

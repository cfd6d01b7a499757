"""Shared builders for tests: real verl DataProto batches with grouped responses."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from verl import DataProto

from tests.support.temp_files import checkpoint_locks, remove_unheld_locks


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


#: Test modules that take minutes (whole verl trainer runs, Ray worker groups, long-context replays), longest first
#: as ``pytest --durations=0`` measured them on 2 cores. ``make test`` gives whole modules to two workers in
#: collection order (``--dist loadfile --no-loadscope-reorder``), so these go first and the short ones fill in
#: behind them: both workers then finish together. A module not listed runs in its usual order, after these.
LONGEST_MODULES_FIRST = (
    "tests/cpu_run/test_async_trainer_on_cpu.py",
    "tests/cpu_run/test_verl_trainer_on_cpu.py",
    "tests/cpu_run/test_separate_async_trainer_on_cpu.py",
    "tests/test_learning_smoke_on_cpu.py",
    "tests/recipes/test_recipes_dry_run_on_cpu.py",
    "tests/replay/test_prefix_sharing_on_cpu.py",
    "tests/replay/test_long_context_compute_on_cpu.py",
    "tests/trainer/test_colocated_engine_options_on_cpu.py",
    "tests/test_cli_mistakes_on_cpu.py",
    "tests/trainer/test_replay_audit_on_cpu.py",
    "tests/trainer/test_two_node_replay_on_cpu.py",
    "tests/trainer/test_colocated_replay_on_cpu.py",
    "tests/demo/test_demo_on_cpu.py",
    "tests/trainer/test_multi_turn_advantage_step_on_cpu.py",
    "tests/replay/test_float32_compute_on_cpu.py",
    "tests/replay/test_replay_numerics_on_cpu.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the modules of :data:`LONGEST_MODULES_FIRST` first, in that order; every module's tests stay together
    and in their own order (a stable sort on the module's rank)."""
    rank = {path: index for index, path in enumerate(LONGEST_MODULES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.fixture
def grouped_batch() -> DataProto:
    return make_grouped_batch(seed=0)


@pytest.fixture(scope="session", autouse=True)
def remove_verl_checkpoint_locks() -> Iterator[None]:
    """The ``ckpt_*.lock`` files verl leaves in the temporary folder during this session are removed at its end."""
    before = checkpoint_locks()
    yield
    remove_unheld_locks(checkpoint_locks() - before)

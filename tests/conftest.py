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

#: The session's model-cache folder and the variable's value before the session.
_SESSION_CACHE = pytest.StashKey[tuple[str, "str | None"]]()


def pytest_configure(config: pytest.Config) -> None:
    """The session's own model cache: converted once per session, never read from or written to the user's.

    Set in the environment before any test starts a process, so every subprocess and every Ray worker of
    the session (they inherit it) reads the one converted embedded model.
    """
    folder = tempfile.mkdtemp(prefix="mrtpo-test-cache-")
    config.stash[_SESSION_CACHE] = (folder, os.environ.get(CACHE_DIR_ENV))
    os.environ[CACHE_DIR_ENV] = folder


def pytest_unconfigure(config: pytest.Config) -> None:
    folder, previous = config.stash[_SESSION_CACHE]
    shutil.rmtree(folder, ignore_errors=True)
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


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

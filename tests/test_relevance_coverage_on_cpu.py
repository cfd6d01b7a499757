"""Nothing changes what is trained without a number: a step whose relevance is missing, or (response, reward) pairs
whose advantage is placed with uniform token weights because their relevance is 0, are counted by the estimator
under ``mrtpo/relevance/…`` (through verl's own compute_advantage) and named once in the log."""

from __future__ import annotations

import logging

import pytest
import torch
from verl.trainer.config import AlgoConfig

import mrtpo_verl.estimator as estimator
from mrtpo_verl.estimator import group_normalised_rewards, reward_component_matrix
from tests.conftest import make_grouped_batch
from tests.test_estimator_on_cpu import REWARDS, mrtpo_config, run_verl

ALGO = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(REWARDS))
COVERAGE = (
    "mrtpo/relevance/missing",
    "mrtpo/relevance/pairs_uniform",
    "mrtpo/relevance/rows_partly_uniform",
    "mrtpo/relevance/rows_all_uniform",
)


@pytest.fixture(autouse=True)
def _nothing_named_yet(monkeypatch):
    monkeypatch.setattr(estimator, "_NAMED", set())  # each test sees the first time of each kind


def mattering_pairs(data) -> torch.Tensor:
    """(bs, K) bool: Â_k ≠ 0 on a response with a valid token, computed here from the rewards by verl's GRPO."""
    rewards = reward_component_matrix(data.non_tensor_batch, REWARDS, len(data))
    advantages = group_normalised_rewards(rewards, data.non_tensor_batch["uid"], 1e-6, True, ALGO)
    return (advantages != 0) & data.batch["response_mask"].bool().any(dim=1, keepdim=True)


def coverage(metrics: dict) -> tuple[float, ...]:
    return tuple(metrics[key] for key in COVERAGE)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == estimator.__name__ and r.levelno == logging.WARNING]


def test_full_relevance_counts_nothing(caplog) -> None:
    data = make_grouped_batch(1)
    _, metrics = run_verl(data, "mrtpo", ALGO, mrtpo_config())
    assert coverage(metrics) == (0.0, 0.0, 0.0, 0.0)
    assert warnings_of(caplog) == []


def test_a_step_without_relevance_is_counted_and_named_once(caplog) -> None:
    data = make_grouped_batch(2, with_relevance=False)
    matters = mattering_pairs(data)
    assert matters.any()
    _, first = run_verl(data, "mrtpo", ALGO, mrtpo_config(), step=4)
    _, second = run_verl(data, "mrtpo", ALGO, mrtpo_config(), step=5)
    every_row = float(matters.any(dim=1).sum())
    assert coverage(first) == coverage(second) == (1.0, float(matters.sum()), 0.0, every_row)
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "no mrtpo_relevance in the batch at global step 4" in messages[0]
    assert "mrtpo/relevance/missing" in messages[0]


def test_pairs_without_relevance_are_counted_per_row(caplog) -> None:
    data = make_grouped_batch(3)
    matters = mattering_pairs(data)
    valid = data.batch["response_mask"].bool()
    both = torch.nonzero(matters.all(dim=1)).flatten().tolist()
    padded = [row for row in both if not valid[row].all()]
    assert len(both) >= 3 and padded, "the batch needs rows where both rewards matter, one of them padded"
    others = [row for row in both if row != padded[0]]
    relevance = data.batch["mrtpo_relevance"]
    relevance[others[0], 0] = 0.0  # one reward of two unscored: a row scored with fewer rewards than matter
    relevance[others[1]] = 0.0  # every reward unscored: the row trains as GDPO
    relevance[padded[0], 1, valid[padded[0]]] = 0.0  # relevance on padding only does not count as scored
    assert relevance[padded[0], 1].any()
    _, metrics = run_verl(data, "mrtpo", ALGO, mrtpo_config())
    assert coverage(metrics) == (0.0, 4.0, 2.0, 1.0)
    messages = warnings_of(caplog)
    assert len(messages) == 1 and "4 (response, reward) pair(s)" in messages[0]
    assert "2 response(s) in part" in messages[0]


def test_a_pair_that_does_not_matter_is_not_counted() -> None:
    data = make_grouped_batch(4)
    matters = mattering_pairs(data)
    idle = torch.nonzero(~matters)
    assert len(idle), "the batch needs a pair with zero advantage"
    row, reward = idle[0].tolist()
    data.batch["mrtpo_relevance"][row, reward] = 0.0  # its advantage is 0: the weights cannot change anything
    _, metrics = run_verl(data, "mrtpo", ALGO, mrtpo_config())
    assert coverage(metrics) == (0.0, 0.0, 0.0, 0.0)


def test_the_uniform_ablation_counts_nothing() -> None:
    data = make_grouped_batch(5, with_relevance=False)
    _, metrics = run_verl(data, "mrtpo", ALGO, mrtpo_config(ablation="uniform"))
    assert not set(COVERAGE) & set(metrics)

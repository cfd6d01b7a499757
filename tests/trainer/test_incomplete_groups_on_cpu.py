"""Prompt groups with fewer than rollout.n responses: verl's own gdpo/grpo rule by default, counted always.

The batch is a real verl ``DataProto`` from which rows are dropped (as a failed session leaves it),
and the advantages come from verl's own ``compute_advantage``; the expected values are computed
here by hand with numpy, group by group.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

import mrtpo_verl.estimator  # noqa: F401  (registers the estimator)
from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError
from mrtpo_verl.estimator import group_normalised_rewards
from mrtpo_verl.trainer.group_completeness import (
    IncompleteGroupError,
    check_whole_groups,
    find_incomplete_groups,
    lenient_message,
)
from tests.conftest import make_grouped_batch

REWARDS = ("format", "correct")
N = 4
EPSILON = 1e-6
#: Rows kept of three groups of four: a whole group, a group that lost one response, a lone response.
KEPT_ROWS = [0, 1, 2, 3, 4, 6, 7, 9]


def incomplete_batch(seed: int):
    data = make_grouped_batch(seed, n_groups=3, group_size=N, reward_keys=REWARDS)
    # Make every group vary in every reward, so that no expected value is trivially 0.
    data.non_tensor_batch["format"][:] = np.arange(len(data)) % 3
    return data.select_idxs(KEPT_ROWS)


def trajectory_keys(data) -> list[str]:
    """verl's ``{uid}_{session}_{index}`` keys, the session being the row's position in its full group."""
    return [f"{data.non_tensor_batch['uid'][i]}_{row % N}_0" for i, row in enumerate(KEPT_ROWS)]


def hand_group_advantages(data) -> np.ndarray:
    """(bs, K) Â_k: each uid over its rows present, unbiased std; a lone row: mean 0, std 1 (verl's rule)."""
    uids = data.non_tensor_batch["uid"]
    out = np.zeros((len(data), len(REWARDS)))
    for k, key in enumerate(REWARDS):
        rewards = np.asarray(data.non_tensor_batch[key], dtype=np.float64)
        for uid in set(uids):
            rows = np.flatnonzero(uids == uid)
            mean, std = (0.0, 1.0) if len(rows) == 1 else (rewards[rows].mean(), rewards[rows].std(ddof=1))
            out[rows, k] = (rewards[rows] - mean) / (std + EPSILON)
    return out


def hand_gdpo(data) -> np.ndarray:
    """Σ_k Â_k on every valid token, whitened over the batch's valid tokens (unbiased variance)."""
    mask = data.batch["response_mask"].numpy().astype(np.float64)
    summed = hand_group_advantages(data).sum(axis=1)[:, None] * mask
    mean = (summed * mask).sum() / mask.sum()
    variance = (((summed - mean) ** 2) * mask).sum() / (mask.sum() - 1)
    return (summed - mean) / np.sqrt(variance + 1e-8) * mask


def run_verl(data, estimator: str, cfg: MRTPOConfig | None = None) -> torch.Tensor:
    algo = AlgoConfig(adv_estimator=estimator, gdpo_reward_keys=list(REWARDS))
    data = data.slice(0, len(data))
    if estimator == "mrtpo":
        with advantage_inputs(data, cfg, global_step=100):
            return compute_advantage(data, adv_estimator="mrtpo", config=algo).batch["advantages"]
    return compute_advantage(data, adv_estimator=estimator, config=algo).batch["advantages"]


@pytest.mark.parametrize("seed", range(3))
def test_verls_gdpo_normalises_each_group_over_the_rows_present(seed: int) -> None:
    data = incomplete_batch(seed)
    advantages = run_verl(data, "gdpo")
    np.testing.assert_allclose(advantages.numpy(), hand_gdpo(data), atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_mrtpo_follows_the_same_rule_on_incomplete_groups(seed: int) -> None:
    data = incomplete_batch(seed)
    cfg = MRTPOConfig(reward_keys=REWARDS, verifier_info_keys=tuple(f"{k}_info" for k in REWARDS), warmup_steps=0)
    # Â_k are verl's, group by group, for the incomplete groups too.
    uids = data.non_tensor_batch["uid"]
    rewards = torch.tensor(np.stack([data.non_tensor_batch[k] for k in REWARDS], axis=1), dtype=torch.float32)
    normalised = group_normalised_rewards(rewards, uids, EPSILON, True, AlgoConfig())
    np.testing.assert_allclose(normalised.numpy(), hand_group_advantages(data), atol=1e-5)
    # Every weight 1: gdpo tensor for tensor; with the relevance: finite, and a different placement.
    uniform = run_verl(data, "mrtpo", MRTPOConfig(**{**cfg.__dict__, "ablation": "uniform"}))
    torch.testing.assert_close(uniform, run_verl(data, "gdpo"), atol=0, rtol=0)
    placed = run_verl(data, "mrtpo", cfg)
    assert torch.isfinite(placed).all() and not torch.equal(placed, uniform)


def test_incomplete_groups_are_counted_and_described() -> None:
    data = incomplete_batch(0)
    incomplete = find_incomplete_groups(trajectory_keys(data), [{}] * len(data), n=N)
    assert incomplete.metrics() == {
        "mrtpo/groups/incomplete": 2.0,
        "mrtpo/groups/incomplete_rows": 4.0,  # three rows of prompt-1, the lone row of prompt-2
        "mrtpo/groups/single_response_rows": 1.0,
    }
    message = lenient_message(incomplete, "mrtpo_sync")
    assert "2 of 3 prompt group(s) (4 rows, 1 alone in their group)" in message
    assert "uid 'prompt-1': sessions [0, 2, 3] present, [1] missing" in message
    assert "uid 'prompt-2': sessions [1] present, [0, 2, 3] missing" in message
    assert "mrtpo.on_incomplete_group=error" in message
    with pytest.raises(IncompleteGroupError, match=r"mrtpo.on_incomplete_group=normalise normalises each group"):
        check_whole_groups(trajectory_keys(data), [{}] * len(data), n=N, mode="mrtpo_sync")


def test_whole_groups_count_zero() -> None:
    keys = [f"u{g}_{s}_0" for g in range(2) for s in range(N)] + ["pad1_0_0"]
    incomplete = find_incomplete_groups(keys, [{}] * (2 * N) + [{"is_padding": True}], n=N)
    assert not incomplete
    assert incomplete.metrics() == {
        "mrtpo/groups/incomplete": 0.0,
        "mrtpo/groups/incomplete_rows": 0.0,
        "mrtpo/groups/single_response_rows": 0.0,
    }


def test_the_policy_is_validated() -> None:
    block = {"reward_keys": ["a"], "verifier_info_keys": ["a_info"]}
    assert MRTPOConfig.from_block(block).on_incomplete_group == "normalise"
    assert MRTPOConfig.from_block({**block, "on_incomplete_group": "error"}).on_incomplete_group == "error"
    with pytest.raises(
        MRTPOConfigError, match=r"^mrtpo.on_incomplete_group: got 'skip' \(allowed: normalise \| error\)"
    ):
        MRTPOConfig.from_block({**block, "on_incomplete_group": "skip"})

"""The registered `mrtpo` estimator: GDPO parity, a hand-computed case, ablations and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils import torch_functional as verl_F

import mrtpo_verl.estimator  # the plugin also registers it; importing makes the dependency explicit
from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.estimator import group_normalised_rewards, reward_component_matrix
from mrtpo_verl.math.reward_reweighting import saw_reward_weights
from mrtpo_verl.math.token_advantage import uniform_statistics, weighted_token_advantage, whiten_with_statistics
from mrtpo_verl.math.token_weights import beta_at_step, token_weights
from tests.conftest import make_grouped_batch

REWARDS = ("format", "correct")


def mrtpo_config(keys: tuple[str, ...] = REWARDS, **overrides: object) -> MRTPOConfig:
    return MRTPOConfig(reward_keys=keys, verifier_info_keys=tuple(f"{k}_info" for k in keys), **overrides)  # type: ignore[arg-type]


def run_verl(data, estimator: str, algo: AlgoConfig, cfg: MRTPOConfig | None = None, step: int = 100):
    """verl's own compute_advantage; for mrtpo inside the advantage_inputs context, as the trainer does."""
    data = data.slice(0, len(data))  # a fresh DataProto: compute_advantage writes into its batch
    if estimator == "mrtpo":
        with advantage_inputs(data, cfg, step) as inputs:
            out = compute_advantage(
                data, adv_estimator="mrtpo", config=algo, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo
            )
        return out.batch["advantages"], inputs.metrics
    out = compute_advantage(
        data, adv_estimator=estimator, config=algo, norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo
    )
    return out.batch["advantages"], {}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keys", [("a",), ("a", "b"), ("a", "b", "c", "d")])
@pytest.mark.parametrize("weights", [None, "random"])
@pytest.mark.parametrize("all_ones", ["beta_zero", "warmup_step_zero", "no_relevance", "uniform_ablation"])
def test_all_weights_one_equals_verl_gdpo_tensor_for_tensor(seed, keys, weights, all_ones) -> None:
    data = make_grouped_batch(seed, reward_keys=keys, with_relevance=all_ones != "no_relevance")
    reward_weights = (
        None if weights is None else [float(w) for w in np.random.default_rng(seed).uniform(0.2, 2.0, len(keys))]
    )
    algo = AlgoConfig(
        adv_estimator="gdpo",
        gdpo_reward_keys=list(keys),
        gdpo_reward_weights=reward_weights,
        norm_adv_by_std_in_grpo=seed % 2 == 0,
    )
    overrides: dict[str, object] = {"reward_weights": None if reward_weights is None else tuple(reward_weights)}
    step = 100
    if all_ones == "beta_zero":
        overrides["beta"] = 0.0
    elif all_ones == "warmup_step_zero":
        step = 0
    elif all_ones == "uniform_ablation":
        overrides["ablation"] = "uniform"
    gdpo, _ = run_verl(data, "gdpo", algo)
    mrtpo, _ = run_verl(data, "mrtpo", algo, mrtpo_config(keys, **overrides), step)
    assert torch.equal(mrtpo, gdpo)


def test_hand_computed_two_responses_three_tokens_two_rewards() -> None:
    """One group of 2 responses, 3 tokens each, rewards a and b, β = 0.5, no warm-up.

    r_a = r_b = (1, 0), so Â_a = Â_b = (s, −s) with s = 0.5 / (√0.5 + 1e-6).
    Response 1: q_a = (0.3, 0, 0) → ρ = (3, 0, 0) → w_a = (2, ½, ½); q_b = (0, 0, 0.2) → w_b = (½, ½, 2).
    Response 2: q_a uniform → w_a = 1; q_b = 0 → w_b = 1.
    Sums: A¹ = s·(2.5, 1, 2.5), A² = −s·(2, 2, 2). Uniform sums are ±2s: mean 0, unbiased var 4s²·6/5.
    """
    relevance = torch.tensor([[[0.3, 0.0, 0.0], [0.0, 0.0, 0.2]], [[0.1, 0.1, 0.1], [0.0, 0.0, 0.0]]])
    non_tensors = {"a": np.array([1.0, 0.0]), "b": np.array([1.0, 0.0]), "uid": np.array(["g", "g"], dtype=object)}
    advantages, returns = get_adv_estimator_fn("mrtpo")(
        token_level_rewards=torch.zeros(2, 3),
        response_mask=torch.ones(2, 3),
        index=non_tensors["uid"],
        config=AlgoConfig(),
        non_tensor_batch=non_tensors,
        batch={"mrtpo_relevance": relevance},
        mrtpo_config=mrtpo_config(("a", "b"), warmup_steps=0),
        global_step=1,
    )
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    scale = 1.0 / math.sqrt(4 * s * s * 6 / 5 + 1e-8)
    expected = torch.tensor([[2.5 * s, 1.0 * s, 2.5 * s], [-2 * s, -2 * s, -2 * s]]) * scale
    assert torch.allclose(advantages, expected, atol=1e-5)
    assert torch.equal(advantages, returns)
    # Per response the total credit equals GDPO's (2s·3 and −2s·3, whitened).
    assert torch.allclose(advantages.sum(1), torch.tensor([6 * s, -6 * s]) * scale, atol=1e-5)


def test_relevance_moves_credit_but_keeps_each_responses_total(grouped_batch) -> None:
    algo = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(REWARDS))
    gdpo, _ = run_verl(grouped_batch, "gdpo", algo)
    mrtpo, metrics = run_verl(grouped_batch, "mrtpo", algo, mrtpo_config())
    assert not torch.allclose(mrtpo, gdpo)
    assert torch.allclose(mrtpo.sum(1), gdpo.sum(1), atol=1e-4)
    assert metrics["mrtpo/beta"] == 0.5
    assert metrics["mrtpo/format/weight_max"] > 1.0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ratio_cap", [None, 2.0])
@pytest.mark.parametrize("row_block", [64, 5, 1])
def test_advantages_equal_the_whole_weights_tensor_formula(seed, ratio_cap, row_block, monkeypatch) -> None:
    """The estimator makes one block of rows and one reward's weights at a time; the result is the (bs, K, L)
    formula's: bit for bit with the same whitening statistics, within 1e-6 of it with verl's float32 statistics."""
    monkeypatch.setattr(mrtpo_verl.estimator, "rows_per_block", lambda length: row_block)
    keys = ("a", "b", "c")
    data = make_grouped_batch(seed, n_groups=5, reward_keys=keys)
    algo = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(keys))
    cfg = mrtpo_config(keys, ratio_cap=ratio_cap, reward_weights=(0.5, 1.0, 2.0))
    relevance = data.batch["mrtpo_relevance"].clone()
    ours, metrics = run_verl(data, "mrtpo", algo, cfg)
    assert torch.equal(data.batch["mrtpo_relevance"], relevance)  # read, never written

    mask = data.batch["response_mask"]
    rewards = reward_component_matrix(data.non_tensor_batch, keys, len(data))
    normalised = group_normalised_rewards(rewards, data.non_tensor_batch["uid"], 1e-6, True, algo)
    c = torch.tensor(cfg.weights_or_ones)
    weights = token_weights(relevance, mask, beta_at_step(cfg.beta, cfg.warmup_steps, 100), ratio_cap)
    uniform = weighted_token_advantage(normalised, None, c, mask)
    placed = weighted_token_advantage(normalised, weights, c, mask)
    mean, variance = uniform_statistics(normalised, c, mask)
    assert torch.equal(ours, whiten_with_statistics(placed, mean, variance) * mask)
    verl_mean, verl_variance = verl_F.masked_mean(uniform, mask), verl_F.masked_var(uniform, mask)
    torch.testing.assert_close(
        ours, whiten_with_statistics(placed, verl_mean, verl_variance) * mask, rtol=1e-6, atol=1e-6
    )
    valid = mask.bool()
    for k, key in enumerate(keys):
        assert metrics[f"mrtpo/{key}/weight_max"] == float(weights[:, k, :][valid].max())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("rows_at_a_time", [1, 4, 64, None])
def test_uniform_statistics_match_verls_masked_mean_and_variance(seed, rows_at_a_time) -> None:
    data = make_grouped_batch(seed, n_groups=6, response_length=37, reward_keys=("a", "b", "c"))
    mask = data.batch["response_mask"]
    rewards = reward_component_matrix(data.non_tensor_batch, ("a", "b", "c"), len(data))
    normalised = group_normalised_rewards(rewards, data.non_tensor_batch["uid"], 1e-6, True, AlgoConfig())
    c = torch.tensor([0.3, 1.0, 1.7])
    uniform = weighted_token_advantage(normalised, None, c, mask)
    mean, variance = uniform_statistics(normalised, c, mask, rows_at_a_time)
    assert mean.dtype == variance.dtype == torch.float32 and mean.shape == variance.shape == ()
    torch.testing.assert_close(mean, verl_F.masked_mean(uniform, mask), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(variance, verl_F.masked_var(uniform, mask), rtol=1e-6, atol=1e-7)


def test_uniform_statistics_refuse_fewer_than_two_tokens_and_blocks_of_no_rows() -> None:
    one_token = torch.tensor([[1, 0], [0, 0]])
    with pytest.raises(ValueError, match="at least two valid tokens"):
        uniform_statistics(torch.ones(2, 1), torch.ones(1), one_token)
    with pytest.raises(ValueError, match="rows_at_a_time must be"):
        uniform_statistics(torch.ones(2, 1), torch.ones(1), torch.ones(2, 2), rows_at_a_time=0)


@pytest.mark.parametrize("seed", range(4))
def test_shuffle_ablation_keeps_each_responses_multiset_of_advantages_per_reward(seed) -> None:
    """With one reward, token advantages are an affine map of the weights: shuffling permutes them."""
    data = make_grouped_batch(seed, reward_keys=("only",))
    algo = AlgoConfig()
    placed, _ = run_verl(data, "mrtpo", algo, mrtpo_config(("only",)))
    shuffled, _ = run_verl(data, "mrtpo", algo, mrtpo_config(("only",), ablation="shuffle", shuffle_seed=seed))
    mask = data.batch["response_mask"].bool()
    assert not torch.equal(placed, shuffled)
    for row in range(len(data)):
        assert torch.allclose(placed[row][mask[row]].sort().values, shuffled[row][mask[row]].sort().values, atol=1e-6)


def test_shuffle_is_reproducible_for_a_seed_and_step(grouped_batch) -> None:
    cfg = mrtpo_config(ablation="shuffle", shuffle_seed=3)
    first, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), cfg, step=7)
    again, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), cfg, step=7)
    other_step, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), cfg, step=8)
    assert torch.equal(first, again) and not torch.equal(first, other_step)


def test_shuffle_draws_do_not_depend_on_the_row_block(grouped_batch, monkeypatch) -> None:
    cfg = mrtpo_config(ablation="shuffle", shuffle_seed=3)
    whole, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), cfg, step=7)
    monkeypatch.setattr(mrtpo_verl.estimator, "rows_per_block", lambda length: 5)
    blocked, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), cfg, step=7)
    assert torch.equal(whole, blocked)


def test_saw_reweighting_equals_mrtpo_with_the_saw_weights(grouped_batch) -> None:
    rewards = torch.tensor(np.stack([grouped_batch.non_tensor_batch[k] for k in REWARDS], 1), dtype=torch.float32)
    saw = tuple(float(c) for c in saw_reward_weights(rewards, torch.ones(2)))
    assert saw != (1.0, 1.0)
    with_saw, metrics = run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config(reweighting="saw"))
    explicit, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config(reward_weights=saw))
    assert torch.allclose(with_saw, explicit, atol=1e-6)
    assert metrics["mrtpo/format/reward_weight"] == pytest.approx(saw[0])


def test_saw_keeps_weights_when_no_reward_varies() -> None:
    assert torch.equal(saw_reward_weights(torch.ones(4, 2), torch.tensor([2.0, 3.0])), torch.tensor([2.0, 3.0]))


def test_singleton_groups_follow_verls_convention() -> None:
    """verl's GRPO gives a group of one mean 0 and std 1: Â = r / (1 + ε), the same in gdpo and mrtpo."""
    data = make_grouped_batch(1, n_groups=4, group_size=1)
    algo = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(REWARDS))
    gdpo, _ = run_verl(data, "gdpo", algo)
    uniform, _ = run_verl(data, "mrtpo", algo, mrtpo_config(ablation="uniform"))
    placed, _ = run_verl(data, "mrtpo", algo, mrtpo_config())
    assert torch.equal(uniform, gdpo)
    assert torch.isfinite(placed).all()


def test_all_padding_response_gets_zero_advantage(grouped_batch) -> None:
    grouped_batch.batch["response_mask"][2] = 0
    advantages, _ = run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config())
    assert torch.equal(advantages[2], torch.zeros_like(advantages[2]))
    assert torch.isfinite(advantages).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_reward_is_an_error_naming_key_and_row(grouped_batch, bad) -> None:
    grouped_batch.non_tensor_batch["correct"][5] = bad
    with pytest.raises(ValueError, match=r"'correct' has NaN/inf values at rows \[5\]"):
        run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config())


def test_missing_reward_key_is_an_error_listing_available_keys(grouped_batch) -> None:
    with pytest.raises(KeyError, match=r"'style' not found.*available"):
        run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config(("format", "style")))


def test_non_numeric_reward_is_an_error(grouped_batch) -> None:
    grouped_batch.non_tensor_batch["format"] = np.array(["yes"] * len(grouped_batch), dtype=object)
    with pytest.raises(ValueError, match="'format' holds non-numeric values"):
        run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config())


def test_relevance_of_the_wrong_shape_is_an_error(grouped_batch) -> None:
    grouped_batch.batch["mrtpo_relevance"] = grouped_batch.batch["mrtpo_relevance"][:, :1]
    with pytest.raises(ValueError, match=r"mrtpo_relevance has shape \(12, 1, 9\), expected"):
        run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config())


def test_fully_padded_batch_is_an_error(grouped_batch) -> None:
    grouped_batch.batch["response_mask"].zero_()
    with pytest.raises(ValueError, match="0 valid response tokens"):
        run_verl(grouped_batch, "mrtpo", AlgoConfig(), mrtpo_config())


def test_stock_call_without_the_context_explains_what_is_missing(grouped_batch) -> None:
    with pytest.raises(ValueError, match="passes them only to 'gdpo'"):
        compute_advantage(grouped_batch, adv_estimator="mrtpo", config=AlgoConfig())


def test_missing_global_step_with_relevance_is_an_error(grouped_batch) -> None:
    with pytest.raises(ValueError, match="global_step"):
        get_adv_estimator_fn("mrtpo")(
            token_level_rewards=grouped_batch.batch["token_level_rewards"],
            response_mask=grouped_batch.batch["response_mask"],
            index=grouped_batch.non_tensor_batch["uid"],
            non_tensor_batch=grouped_batch.non_tensor_batch,
            batch=grouped_batch.batch,
            mrtpo_config=mrtpo_config(),
        )

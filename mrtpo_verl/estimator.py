"""The ``mrtpo`` advantage estimator, registered in verl's advantage-estimator registry.

Per response j and reward k:

1. ``Â_k^(j)``: group-normalised reward k, computed by verl's own GRPO outcome advantage
   (so unbiased std, its ε, and its singleton-group convention are verl's).
2. ``w_{k,t}^(j)``: token weights from the replay's relevance ``q`` (``batch["mrtpo_relevance"]``,
   (bs, K, L)) at the step's ``β_s``; see :mod:`mrtpo_verl.math.token_weights`.
3. ``A_t^(j) = Σ_k c_k · w_{k,t}^(j) · Â_k^(j)``, whitened with the batch statistics of the uniform
   sum ``Σ_k c_k · Â_k^(j)`` that verl's ``gdpo`` whitens; with every weight 1 the output is
   ``gdpo``'s, tensor for tensor. When weights are made, the advantages are made a block of rows at a time in
   one (bs, L) output and the statistics summed in float64 over the blocks (no (bs, L) temporaries beside the
   relevance); they differ from verl's float32 whole-tensor sums by those sums' rounding only.

Documented edge cases:
- A group of one response: verl's GRPO gives it mean 0 and std 1, so ``Â_k = r_k / (1 + ε)``
  (not 0). We keep verl's convention so that uniform MRTPO equals ``gdpo``; use ``rollout.n ≥ 2``.
- A response with no valid token gets advantage 0 everywhere (it is all padding).
- A batch with fewer than two valid tokens cannot be whitened: a clear error.
- NaN/inf rewards, missing reward keys, or relevance of the wrong shape: a clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, register_adv_est
from verl.utils import torch_functional as verl_F

from mrtpo_verl.advantage_inputs import current_advantage_inputs
from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.math.reward_reweighting import saw_reward_weights
from mrtpo_verl.math.token_advantage import (
    rows_per_block,
    uniform_statistics,
    weighted_token_advantage,
    whiten_with_statistics,
)
from mrtpo_verl.math.token_weights import beta_at_step, shuffle_within_responses, token_weights

__all__ = [
    "ESTIMATOR_NAME",
    "RELEVANCE_KEY",
    "compute_mrtpo_outcome_advantage",
    "group_normalised_rewards",
    "relevance_coverage",
    "relevance_coverage_metrics",
    "replay_needed",
    "reward_component_matrix",
]

logger = logging.getLogger(__name__)

ESTIMATOR_NAME = "mrtpo"
#: ``DataProto.batch`` key of the replay's relevance tensor, (bs, K, response_length), K in reward-key order.


def reward_component_matrix(
    non_tensor_batch: Mapping[str, Any], reward_keys: tuple[str, ...], batch_size: int
) -> torch.Tensor:
    """Stack the reward components that the reward function returned into a (bs, K) float32 tensor.

    Args:
        non_tensor_batch: DataProto.non_tensor_batch holding one numeric array per reward key.
        reward_keys: the configured reward keys, in order.
        batch_size: expected number of responses.

    Raises:
        KeyError: a reward key is missing (the message lists what is there).
        ValueError: wrong length, non-numeric, NaN or infinite values (first offending rows named).
    """
    columns = []
    for key in reward_keys:
        if key not in non_tensor_batch:
            raise KeyError(
                f"mrtpo: reward key {key!r} not found in non_tensor_batch (available: {sorted(non_tensor_batch)}); "
                "the reward function must return it for every sample"
            )
        try:
            values = np.asarray(non_tensor_batch[key], dtype=np.float32)
        except (TypeError, ValueError) as error:
            raise ValueError(f"mrtpo: reward key {key!r} holds non-numeric values: {error}") from error
        if values.shape != (batch_size,):
            raise ValueError(f"mrtpo: reward key {key!r} has shape {values.shape}, expected ({batch_size},)")
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(
                f"mrtpo: reward key {key!r} has NaN/inf values at rows {bad[:5].tolist()} "
                f"(e.g. {values[bad[0]]}); fix the reward function rather than train on them"
            )
        columns.append(torch.from_numpy(values))
    return torch.stack(columns, dim=1)


def group_normalised_rewards(
    rewards: torch.Tensor, index: np.ndarray, epsilon: float, norm_by_std: bool, config: Any
) -> torch.Tensor:
    """Â_k for every reward through verl's GRPO outcome advantage, one reward at a time.

    Args:
        rewards: (bs, K) reward components.
        index: (bs,) group ids.
        epsilon: GRPO's std floor.
        norm_by_std: divide by the group std.
        config: verl's AlgoConfig, passed through.

    Returns:
        (bs, K) float32 group-normalised advantages.
    """
    ones = torch.ones(rewards.shape[0], 1, dtype=torch.float32)
    columns = []
    for k in range(rewards.shape[1]):
        normalised, _ = compute_grpo_outcome_advantage(
            token_level_rewards=rewards[:, k : k + 1].clone(),
            response_mask=ones,
            index=index,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_by_std,
            config=config,
        )
        columns.append(normalised[:, 0])
    return torch.stack(columns, dim=1)


def replay_needed(
    rewards: torch.Tensor, index: np.ndarray, epsilon: float, norm_by_std: bool, config: Any
) -> torch.Tensor:
    """Exact skipping: which (response, reward) pairs the replay must score.

    Reward k's token weights multiply ``Â_k``; where ``Â_k = 0`` for every response of a group
    (reward k constant in the group) the weights cannot change the advantage, so the pair needs
    no replay. Computed with the same verl GRPO helper as the advantage itself, so "zero" means
    exactly the zeros the estimator will see.

    Args:
        rewards: (bs, K) reward components.
        index: (bs,) group ids.

    Returns:
        (bs, K) bool, True where the replay is needed.
    """
    advantages = group_normalised_rewards(rewards, index, epsilon, norm_by_std, config)
    nonzero = advantages != 0
    groups = {uid: np.flatnonzero(index == uid) for uid in dict.fromkeys(index.tolist())}
    needed = torch.zeros_like(nonzero)
    for rows in groups.values():
        needed[rows] = nonzero[rows].any(dim=0, keepdim=True).expand(len(rows), -1)
    return needed


def _relevance_or_none(batch: Mapping[str, Any] | None, shape: tuple[int, int, int]) -> torch.Tensor | None:
    if batch is None or RELEVANCE_KEY not in batch.keys():  # noqa: SIM118  (TensorDict)
        return None
    relevance: torch.Tensor = batch[RELEVANCE_KEY]
    if tuple(relevance.shape) != shape:
        raise ValueError(
            f"mrtpo: {RELEVANCE_KEY} has shape {tuple(relevance.shape)}, expected (bs, K, response_length) = {shape}"
        )
    return relevance


def _beta_for_step(relevance: torch.Tensor | None, cfg: MRTPOConfig, global_step: int | None) -> float:
    """β_s of this step; 0 when every weight is 1 (uniform ablation, no relevance, warm-up at 0)."""
    if cfg.ablation == "uniform":
        return 0.0
    if relevance is None:  # counted in mrtpo/relevance/missing (relevance_coverage_metrics)
        return 0.0
    if global_step is None:
        raise ValueError("mrtpo: global_step is needed for the β warm-up; pass it or open advantage_inputs(...)")
    return beta_at_step(cfg.beta, cfg.warmup_steps, global_step)


def _placed_advantage(
    relevance: torch.Tensor,
    reward_advantages: torch.Tensor,
    reward_weights: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: MRTPOConfig,
    beta_s: float,
    global_step: int,
) -> tuple[torch.Tensor, dict[int, float]]:
    """Whitened, masked ``Σ_k c_k · w_k · Â_k`` (bs, L), and each reward's largest token weight over valid tokens.

    Made in one (bs, L) output, :func:`~mrtpo_verl.math.token_advantage.rows_per_block` rows at a time: for reward
    k after reward k, each block's weights (rows, 1, L) are made and their term added to the block's output (the sum
    :func:`~mrtpo_verl.math.token_advantage.weighted_token_advantage` makes, in the same order); then each block is
    whitened in place with the uniform sum's statistics (:func:`~mrtpo_verl.math.token_advantage.uniform_statistics`)
    and masked. Besides the relevance the driver holds the output and a few (rows, L) temporaries. The shuffle
    ablation permutes the weights with one generator seeded by ``shuffle_seed`` and the step, drawn reward after
    reward and block after block (the same draws as one (bs, 1, L) draw per reward).
    """
    generator = None
    if cfg.ablation == "shuffle":
        generator = torch.Generator(device=response_mask.device).manual_seed(cfg.shuffle_seed * 1_000_003 + global_step)
    block = rows_per_block(response_mask.shape[1])
    mean, variance = uniform_statistics(reward_advantages, reward_weights, response_mask, block)
    placed = torch.empty(response_mask.shape, dtype=reward_advantages.dtype, device=response_mask.device)
    blocks = [slice(start, start + block) for start in range(0, response_mask.shape[0], block)]
    maxima: dict[int, float] = {}
    for k in range(reward_advantages.shape[1]):
        for rows in blocks:
            mask = response_mask[rows]
            weights = token_weights(relevance[rows, k : k + 1].to(mask.device), mask, beta_s, cfg.ratio_cap)
            if generator is not None:
                weights = shuffle_within_responses(weights, mask, generator)
            valid = mask.bool()
            if bool(valid.any()):
                largest = float(weights[:, 0, :][valid].max())
                maxima[k] = max(maxima.get(k, largest), largest)
            advantage_k = reward_advantages[rows, k : k + 1]
            term = weighted_token_advantage(advantage_k, weights, reward_weights[k : k + 1], mask)
            if k == 0:
                placed[rows] = term
            else:
                placed[rows].add_(term)  # the same sum as placed + term, in place
            del weights, term
    for rows in blocks:
        placed[rows] = whiten_with_statistics(placed[rows], mean, variance) * response_mask[rows]
    return placed, maxima


@register_adv_est(ESTIMATOR_NAME)
def compute_mrtpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Mapping[str, Any] | None = None,
    mrtpo_config: MRTPOConfig | None = None,
    global_step: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MRTPO token advantages: each reward's group advantage placed on its relevant tokens.

    Accepts every keyword verl's ``compute_advantage`` passes (``token_level_rewards``,
    ``response_mask``, ``config``, ``index``, optional ``reward_baselines``); the rest comes as
    explicit keywords or from :func:`mrtpo_verl.advantage_inputs.advantage_inputs`.

    Args:
        token_level_rewards: (bs, L) verl's summed token rewards (unused: MRTPO reads the components).
        response_mask: (bs, L) valid response tokens.
        index: (bs,) group id per response (``uid``).
        epsilon: GRPO's std floor.
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr.GRPO).
        config: verl's ``AlgoConfig`` (passed to verl's GRPO helper).
        non_tensor_batch: reward components, one (bs,) array per reward key.
        batch: tensor batch; ``batch["mrtpo_relevance"]`` (bs, K, L) when the replay ran.
        mrtpo_config: the ``mrtpo`` block.
        global_step: the trainer's global step for the β warm-up.

    Returns:
        (advantages, returns), both (bs, L), equal (outcome-only estimator).
    """
    inputs = current_advantage_inputs()
    if inputs is not None:
        non_tensor_batch = non_tensor_batch if non_tensor_batch is not None else inputs.non_tensor_batch
        batch = batch if batch is not None else inputs.batch
        mrtpo_config = mrtpo_config if mrtpo_config is not None else inputs.mrtpo_config
        global_step = global_step if global_step is not None else inputs.global_step
    if mrtpo_config is None or non_tensor_batch is None:
        raise ValueError(
            "mrtpo: the estimator needs the reward components and the mrtpo config. verl's compute_advantage "
            "passes them only to 'gdpo'; run it inside mrtpo_verl.advantage_inputs.advantage_inputs(data, cfg, step) "
            "(the MRTPO trainer does) or pass non_tensor_batch=, mrtpo_config=, global_step= explicitly"
        )
    if index is None:
        raise ValueError("mrtpo: index (the uid of each response's group) is required")
    batch_size, response_length = response_mask.shape
    valid_tokens = int(response_mask.sum())
    if valid_tokens < 2:
        raise ValueError(f"mrtpo: the batch has {valid_tokens} valid response tokens; whitening needs at least 2")

    cfg = mrtpo_config
    rewards = reward_component_matrix(non_tensor_batch, cfg.reward_keys, batch_size).to(response_mask.device)
    reward_weights = torch.tensor(cfg.weights_or_ones, dtype=torch.float32, device=response_mask.device)
    if cfg.reweighting == "saw":
        reward_weights = saw_reward_weights(rewards, reward_weights)
    reward_advantages = group_normalised_rewards(rewards, index, epsilon, norm_adv_by_std_in_grpo, config)

    relevance = _relevance_or_none(batch, (batch_size, len(cfg.reward_keys), response_length))
    beta_s = _beta_for_step(relevance, cfg, global_step)

    weight_maxima: dict[int, float] = {}
    if beta_s != 0.0 and relevance is not None and global_step is not None:
        advantages, weight_maxima = _placed_advantage(
            relevance, reward_advantages, reward_weights, response_mask, cfg, beta_s, global_step
        )
    else:  # every weight is 1: gdpo's computation, whole-tensor statistics included, so the result is gdpo's
        uniform = weighted_token_advantage(reward_advantages, None, reward_weights, response_mask)
        mean = verl_F.masked_mean(uniform, response_mask)
        variance = verl_F.masked_var(uniform, response_mask)
        advantages = whiten_with_statistics(uniform, mean, variance) * response_mask

    if inputs is not None:
        inputs.metrics.update(_step_metrics(cfg, beta_s, weight_maxima, reward_weights))
        if cfg.ablation != "uniform" and cfg.beta > 0:  # where relevance decides the weights
            inputs.metrics.update(relevance_coverage_metrics(relevance, reward_advantages, response_mask, global_step))
    return advantages, advantages


def relevance_coverage(
    relevance: torch.Tensor | None, reward_advantages: torch.Tensor, response_mask: torch.Tensor
) -> tuple[int, int, int]:
    """How much of the batch trains with uniform token weights because its relevance is missing.

    A pair (response j, reward k) *matters* when ``Â_k^(j) ≠ 0`` and the response has a valid token; it is
    *uniform* when it matters and its relevance is 0 on every valid token (q̄ = 0 gives weight 1 everywhere: GDPO
    for that pair), e.g. a row the replay could not fit, a failed replay under ``on_worker_failure: uniform``, a
    leave-one-out context equal to the full one, or no relevance at all (``relevance`` None). Read
    :func:`~mrtpo_verl.math.token_advantage.rows_per_block` rows at a time.

    Args:
        relevance: (bs, K, L) or None.
        reward_advantages: (bs, K) ``Â``.
        response_mask: (bs, L).

    Returns:
        (uniform pairs, rows with some but not all of their mattering pairs uniform, rows with all of them uniform).
    """
    block = rows_per_block(response_mask.shape[1])
    pairs = partly = wholly = 0
    for start in range(0, response_mask.shape[0], block):
        rows = slice(start, start + block)
        valid = response_mask[rows].bool()
        matters = (reward_advantages[rows] != 0) & valid.any(dim=1, keepdim=True)
        if relevance is None:
            uniform = matters
        else:
            q = relevance[rows].to(valid.device)
            uniform = matters & ~(torch.where(valid[:, None, :], q, 0.0).amax(dim=2) > 0)
        per_row, mattering = uniform.sum(dim=1), matters.sum(dim=1)
        pairs += int(per_row.sum())
        wholly += int(((per_row == mattering) & (mattering > 0)).sum())
        partly += int(((per_row > 0) & (per_row < mattering)).sum())
    return pairs, partly, wholly


_NAMED: set[str] = set()


def relevance_coverage_metrics(
    relevance: torch.Tensor | None,
    reward_advantages: torch.Tensor,
    response_mask: torch.Tensor,
    global_step: int | None,
) -> dict[str, float]:
    """``mrtpo/relevance/missing`` (1: no relevance in the batch, the whole step is GDPO), ``pairs_uniform``,
    ``rows_partly_uniform`` (scored with fewer rewards than matter for them) and ``rows_all_uniform``
    (:func:`relevance_coverage`); each kind named once in the log, the first step it happens."""
    pairs, partly, wholly = relevance_coverage(relevance, reward_advantages, response_mask)
    metrics = {
        "mrtpo/relevance/missing": float(relevance is None),
        "mrtpo/relevance/pairs_uniform": float(pairs),
        "mrtpo/relevance/rows_partly_uniform": float(partly),
        "mrtpo/relevance/rows_all_uniform": float(wholly),
    }
    if relevance is None:
        _name_once(
            "missing",
            "mrtpo: no %s in the batch at global step %s: every token weight is 1 (GDPO) for this step; counted in "
            "mrtpo/relevance/missing. Run the estimator through the MRTPO trainer (its replay stage fills it)",
            RELEVANCE_KEY,
            global_step,
        )
    elif pairs:
        _name_once(
            "uniform",
            "mrtpo: at global step %s, %d (response, reward) pair(s) with a nonzero advantage have no relevance and "
            "train with uniform token weights (%d response(s) in part, %d wholly); counted every step in "
            "mrtpo/relevance/pairs_uniform, rows_partly_uniform, rows_all_uniform. See mrtpo/replay/rows_unscored "
            "(raise mrtpo.replay.max_context_tokens) and mrtpo/replay/failed",
            global_step,
            pairs,
            partly,
            wholly,
        )
    return metrics


def _name_once(kind: str, message: str, *args: Any) -> None:
    if kind not in _NAMED:
        _NAMED.add(kind)
        logger.warning(message, *args)


def _step_metrics(
    cfg: MRTPOConfig, beta_s: float, weight_maxima: dict[int, float], reward_weights: torch.Tensor
) -> dict[str, float]:
    """β_s, reward weights and the largest token weight per reward (when weights were made), for verl's tracking."""
    metrics = {"mrtpo/beta": beta_s}
    for k, key in enumerate(cfg.reward_keys):
        metrics[f"mrtpo/{key}/reward_weight"] = float(reward_weights[k])
        if k in weight_maxima:
            metrics[f"mrtpo/{key}/weight_max"] = weight_maxima[k]
    return metrics

"""Per-token, per-reward credit for pictures: where each reward's advantage lands under GDPO and MRTPO.

For response j, reward k and token t (before the batch whitening both methods share):

    GDPO:   c_k · Â_k^(j)              (the same on every token)
    MRTPO:  c_k · w_{k,t}^(j) · Â_k^(j)

and the final advantages are verl's ``compute_advantage`` output for ``gdpo`` and ``mrtpo``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from verl.protocol import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.estimator import group_normalised_rewards, reward_component_matrix
from mrtpo_verl.math.token_weights import beta_at_step, token_weights

__all__ = ["TokenCredit", "token_credit"]


@dataclass
class TokenCredit:
    """Credit of a batch.

    Attributes:
        gdpo_per_reward: (bs, K, L) c_k Â_k on valid tokens.
        mrtpo_per_reward: (bs, K, L) c_k w_{k,t} Â_k on valid tokens.
        gdpo: (bs, L) verl's final gdpo advantages.
        mrtpo: (bs, L) verl's final mrtpo advantages.
        weights: (bs, K, L) MRTPO token weights at this step's β.
        beta: β_s of the step.
    """

    gdpo_per_reward: torch.Tensor
    mrtpo_per_reward: torch.Tensor
    gdpo: torch.Tensor
    mrtpo: torch.Tensor
    weights: torch.Tensor
    beta: float


def token_credit(data: DataProto, relevance: torch.Tensor, cfg: MRTPOConfig, global_step: int) -> TokenCredit:
    """Credit for ``data`` (with ``uid``, masks and reward components) given the replay's relevance (bs, K, L)."""
    algo = AlgoConfig(
        adv_estimator="gdpo",
        gdpo_reward_keys=list(cfg.reward_keys),
        gdpo_reward_weights=list(cfg.reward_weights) if cfg.reward_weights else None,
    )
    mask = data.batch["response_mask"]
    rewards = reward_component_matrix(data.non_tensor_batch, cfg.reward_keys, len(data))
    advantages = group_normalised_rewards(rewards, data.non_tensor_batch["uid"], 1e-6, True, algo)
    c = torch.tensor(cfg.weights_or_ones)
    beta = beta_at_step(cfg.beta, cfg.warmup_steps, global_step)
    weights = token_weights(relevance, mask, beta, cfg.ratio_cap)
    valid = mask.bool().unsqueeze(1)
    per_reward = (c[None, :, None] * advantages[:, :, None]).expand_as(weights)
    gdpo = compute_advantage(data.slice(0, len(data)), adv_estimator="gdpo", config=algo).batch["advantages"]
    batch = data.slice(0, len(data))
    batch.batch[RELEVANCE_KEY] = relevance
    with advantage_inputs(batch, cfg, global_step):
        mrtpo = compute_advantage(batch, adv_estimator="mrtpo", config=algo).batch["advantages"]
    return TokenCredit(
        gdpo_per_reward=per_reward * valid,
        mrtpo_per_reward=per_reward * weights * valid,
        gdpo=gdpo,
        mrtpo=mrtpo,
        weights=weights,
        beta=beta,
    )

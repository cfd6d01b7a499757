"""verl's own old-log-prob computation, the reference the replay benchmarks price a pass against."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["verl_old_log_probs"]


def verl_old_log_probs(model: Any, input_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """What verl's actor does for old log-probs: full forward, logits / τ, log-probs of the response tokens.

    Args:
        model: a causal LM.
        input_ids: (n, P + R) prompt and response tokens, unpadded.
        response_length: R.

    Returns:
        (n, R) log-probabilities of the response tokens.
    """
    from verl.utils.torch_functional import logprobs_from_logits

    attention_mask = torch.ones_like(input_ids)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        logits.div_(1.0)
        logits = logits[:, -response_length - 1 : -1, :]
        return logprobs_from_logits(logits, input_ids[:, -response_length:])

"""verl's rollout batch layout, and a by-hand reference relevance (Jensen–Shannon distance), for replay tests.

The layout is the one verl 0.9.1's agent loop produces (``AgentLoopWorker._agent_loop_postprocess``):
prompts left-padded to the prompt width, responses right-padded to the response width, ``attention_mask``
(bs, P + L) = prompt mask ‖ response mask (1 on every real response token, tool outputs included), and
``response_mask`` (bs, L) = the agent loop's own mask (1 on generated tokens, 0 on tool outputs) times the
response's attention mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def verl_rollout_tensors(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    response_masks: Sequence[Sequence[int]],
    prompt_width: int,
    response_width: int,
    pad_id: int,
) -> dict[str, torch.Tensor]:
    """``prompts`` (bs, P), ``responses`` (bs, L), ``response_mask`` (bs, L), ``attention_mask`` (bs, P + L)."""
    bs = len(prompts)
    prompt_ids = torch.full((bs, prompt_width), pad_id, dtype=torch.long)
    prompt_attention = torch.zeros(bs, prompt_width, dtype=torch.long)
    response_ids = torch.full((bs, response_width), pad_id, dtype=torch.long)
    response_attention = torch.zeros(bs, response_width, dtype=torch.long)
    agent_mask = torch.zeros(bs, response_width, dtype=torch.long)
    for row, (prompt, response, mask) in enumerate(zip(prompts, responses, response_masks, strict=True)):
        if len(prompt) > prompt_width or len(response) > response_width or len(mask) != len(response):
            raise ValueError(f"row {row}: {len(prompt)} prompt / {len(response)} response / {len(mask)} mask tokens")
        prompt_ids[row, prompt_width - len(prompt) :] = torch.tensor(prompt)
        prompt_attention[row, prompt_width - len(prompt) :] = 1
        response_ids[row, : len(response)] = torch.tensor(response)
        response_attention[row, : len(response)] = 1
        agent_mask[row, : len(mask)] = torch.tensor(mask)
    return {
        "prompts": prompt_ids,
        "responses": response_ids,
        "response_mask": agent_mask * response_attention,
        "attention_mask": torch.cat([prompt_attention, response_attention], dim=1),
    }


def reference_js_distance(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """(n, vocab) × 2 → (n,) Jensen–Shannon distance in bits, written out in float64 from its definition.

    JS(P, Q) = ½ KL(P ‖ M) + ½ KL(Q ‖ M) with M = ½ (P + Q), log base 2; the distance is its square root.
    """
    p = torch.softmax(logits_p.double(), dim=-1)
    q = torch.softmax(logits_q.double(), dim=-1)
    m = (p + q) / 2

    def kl_to_m(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x * (x.log2() - m.log2()), torch.zeros_like(x)).sum(dim=-1)

    return ((kl_to_m(p) + kl_to_m(q)) / 2).clamp(min=0).sqrt()


def by_hand_relevance(model: Any, contexts: Any, response: Sequence[int]) -> torch.Tensor:
    """(K, T) reference relevance of a T-token response: one plain forward pass of ``model`` per context over
    ``context + response``, and :func:`reference_js_distance` between the full context's next-token logits and
    each leave-one-out context's, at every response position.

    ``contexts``: a :class:`~mrtpo_verl.replay.contexts.ReplayContexts` (``full_context_ids``,
    ``leave_one_out_ids``).
    """
    response = list(response)

    def response_logits(context: Sequence[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = model(torch.tensor([[*context, *response]])).logits[0]
        return logits[len(context) - 1 : len(context) - 1 + len(response)]

    full = response_logits(contexts.full_context_ids)
    return torch.stack([reference_js_distance(full, response_logits(c)) for c in contexts.leave_one_out_ids])

"""Where a reward's replay distance falls: the paper's Table 4 localisation ratio.

For one response with relevance ``q`` (K, T) and a *part* of the response (a boolean mask over its T
tokens, e.g. the tokens its verifier reads):

    dist_share_k = Σ_{t ∈ part} q_{k,t} / Σ_t q_{k,t}      share of reward k's total distance on the part
    token_share  = |part| / T                               share of the tokens in the part
    ratio_k      = dist_share_k / token_share                uniform relevance gives exactly 1

A ratio above 1 means reward k's relevance concentrates on the part. The paper's Table 4 reports the
same quantity (Dist. % / Tok. %) per constraint type.

Parts are usually given as character spans of the decoded response; :func:`token_char_spans` maps the
*replayed* token ids to character spans by decoding prefixes token by token (so the ids are never
re-tokenized), and :func:`part_mask` turns character spans into the token mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = ["find_spans", "localisation_ratio", "part_mask", "token_char_spans"]


def localisation_ratio(relevance: torch.Tensor, part: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """Per reward, the share of its distance on ``part`` divided by the part's share of tokens.

    Args:
        relevance: (K, T) relevance ``q ≥ 0`` of one response.
        part: (T,) bool, the tokens of the part.
        valid: (T,) bool, the response's valid tokens (default: all T); tokens outside it count nowhere.

    Returns:
        (K,) float64 ratios; NaN for a reward with zero total distance, or when the part holds no valid token.
    """
    if relevance.dim() != 2:
        raise ValueError(f"relevance must be (K, T), got shape {tuple(relevance.shape)}")
    num_tokens = relevance.shape[1]
    if part.shape != (num_tokens,):
        raise ValueError(f"part must be a ({num_tokens},) mask, got shape {tuple(part.shape)}")
    valid = torch.ones(num_tokens, dtype=torch.bool) if valid is None else valid.bool().cpu()
    if valid.shape != (num_tokens,):
        raise ValueError(f"valid must be a ({num_tokens},) mask, got shape {tuple(valid.shape)}")
    in_part = part.bool().cpu() & valid
    q = torch.where(valid, relevance.detach().double().cpu(), 0.0)
    total = q.sum(-1)
    on_part = q[:, in_part].sum(-1)
    token_share = in_part.sum().double() / valid.sum().double().clamp(min=1)
    if not bool(in_part.any()):
        return torch.full((relevance.shape[0],), torch.nan, dtype=torch.float64)
    ratio = (on_part / total.clamp(min=torch.finfo(torch.float64).tiny)) / token_share
    return torch.where(total > 0, ratio, torch.nan)


def token_char_spans(tokenizer: Any, response_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character span of every response token in ``tokenizer.decode(response_ids)``.

    The spans come from decoding the prefixes ``ids[:1], ids[:2], ...`` (special tokens kept, no clean-up),
    so they refer to exactly the ids that were replayed. A token that ends inside a multi-byte character
    (the prefix decodes to a trailing U+FFFD) gets an empty span and the character goes to the token that
    completes it.

    Args:
        tokenizer: a transformers tokenizer.
        response_ids: (T,) token ids.

    Returns:
        T ``(start, end)`` pairs, contiguous and non-decreasing.
    """
    spans: list[tuple[int, int]] = []
    previous = 0
    ids = [int(i) for i in response_ids]
    for end in range(1, len(ids) + 1):
        prefix = tokenizer.decode(ids[:end], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        length = max(previous, len(prefix.rstrip("\ufffd")))
        spans.append((previous, length))
        previous = length
    return spans


def part_mask(token_spans: Sequence[tuple[int, int]], char_spans: Iterable[tuple[int, int]]) -> torch.Tensor:
    """(T,) bool: the tokens whose character span overlaps any of ``char_spans`` (half-open ``[start, end)``).

    Args:
        token_spans: per token ``(start, end)``, from :func:`token_char_spans`.
        char_spans: the part's character spans in the decoded response.
    """
    wanted = list(char_spans)
    return torch.tensor(
        [any(start < part_end and part_start < end for part_start, part_end in wanted) for start, end in token_spans],
        dtype=torch.bool,
    )


def find_spans(text: str, needle: str) -> list[tuple[int, int]]:
    """Every non-overlapping occurrence of ``needle`` in ``text`` as ``[start, end)``; ValueError if none."""
    if not needle:
        raise ValueError("needle is empty")
    spans, start = [], text.find(needle)
    while start >= 0:
        spans.append((start, start + len(needle)))
        start = text.find(needle, start + len(needle))
    if not spans:
        raise ValueError(f"{needle!r} does not occur in the text")
    return spans

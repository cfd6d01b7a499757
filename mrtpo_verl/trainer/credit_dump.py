"""``mrtpo.dump_dir``: write each step's token credit so the pictures can be drawn for a real run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from verl.protocol import DataProto

from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.credit.token_credit import token_credit
from mrtpo_verl.credit.views import views_from_batch, write_views

__all__ = ["dump_step"]


def dump_step(
    directory: str, data: DataProto, relevance: torch.Tensor, cfg: MRTPOConfig, step: int, tokenizer: Any
) -> Path:
    """Write ``<directory>/step_<step>.jsonl`` (run facts, then one response view per line)."""
    credit = token_credit(data, relevance, cfg, step)
    views = views_from_batch(data, credit, tokenizer, cfg.reward_keys, cfg.verifier_info_keys)
    path = Path(directory) / f"step_{step}.jsonl"
    write_views(path, views, {"step": step, "β_s": credit.beta, "reward_keys": list(cfg.reward_keys)})
    return path

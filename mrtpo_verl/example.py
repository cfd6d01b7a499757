"""A built-in worked example: MRTPO vs GDPO token advantages for one group of SQL answers.

Run ``python -m mrtpo_verl.example``. The question, responses and rewards follow the paper's
Figure 1 (an answer that is well formed and executable but uses ``>=`` for ``>``). The relevance
here is *illustrative*, not measured: each verifier's relevance is set high on the part of the
response that verifier reads (the tags for format, the query for executability, the condition for
execution). Everything after that — group advantages, token weights, whitening — is the real
``mrtpo`` estimator, called through verl's own ``compute_advantage``. The full demo replays real
model outputs with a real model instead.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig

REWARD_KEYS = ("format", "executability", "execution")
QUESTION = "How many singers are older than 30?"
#: (response, (format, executability, execution)) for one group of four samples.
GROUP = (
    ("<answer> SELECT count(*) FROM singer WHERE age > 30 </answer>", (1.0, 1.0, 1.0)),
    ("<answer> SELECT count(*) FROM singer WHERE age >= 30 </answer>", (1.0, 1.0, 0.0)),
    ("<answer> SELECT count(*) FROM singers WHERE age > 30 </answer>", (1.0, 0.0, 0.0)),
    ("SELECT count(*) FROM singer WHERE age > 30", (0.0, 1.0, 1.0)),
)
_TAG = re.compile(r"</?answer>")


def tokenize(response: str) -> list[str]:
    """Whitespace tokens: enough to show where credit lands."""
    return response.split()


def illustrative_relevance(tokens: list[str]) -> np.ndarray:
    """(K, T) relevance that is high where each verifier reads (see the module docstring)."""
    in_condition = False
    rows = np.full((len(REWARD_KEYS), len(tokens)), 0.02)
    for t, token in enumerate(tokens):
        in_condition = in_condition or token == "WHERE"
        if _TAG.fullmatch(token):
            rows[0, t] = 0.6
        else:
            rows[1, t] = 0.3 if token in {"FROM", "singer", "singers"} else 0.1
            rows[2, t] = 0.5 if in_condition and token != "WHERE" else 0.05
    return rows


def build_batch() -> DataProto:
    """One group of four responses as a verl DataProto, with relevance in ``mrtpo_relevance``."""
    token_lists = [tokenize(text) for text, _ in GROUP]
    length = max(len(tokens) for tokens in token_lists)
    mask = torch.zeros(len(GROUP), length, dtype=torch.long)
    relevance = torch.zeros(len(GROUP), len(REWARD_KEYS), length)
    for j, tokens in enumerate(token_lists):
        mask[j, : len(tokens)] = 1
        relevance[j, :, : len(tokens)] = torch.from_numpy(illustrative_relevance(tokens)).float()
    non_tensors = {"uid": np.array(["q0"] * len(GROUP), dtype=object)}
    for k, key in enumerate(REWARD_KEYS):
        non_tensors[key] = np.array([rewards[k] for _, rewards in GROUP])
    tensors = {
        "response_mask": mask,
        "token_level_rewards": torch.zeros(len(GROUP), length),
        RELEVANCE_KEY: relevance,
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


def advantages(data: DataProto, estimator: str) -> torch.Tensor:
    """Token advantages from verl's compute_advantage (mrtpo at the end of its warm-up)."""
    algo = AlgoConfig(adv_estimator=estimator, gdpo_reward_keys=list(REWARD_KEYS))
    fresh = data.slice(0, len(data))
    if estimator == "gdpo":
        # verl's gdpo reads the response length from prompts/attention_mask.
        fresh.batch["prompts"] = torch.zeros(len(data), 1, dtype=torch.long)
        fresh.batch["attention_mask"] = torch.cat(
            [torch.ones(len(data), 1, dtype=torch.long), data.batch["response_mask"]], 1
        )
        return compute_advantage(fresh, adv_estimator="gdpo", config=algo).batch["advantages"]
    cfg = MRTPOConfig(reward_keys=REWARD_KEYS, verifier_info_keys=tuple(f"{k}_info" for k in REWARD_KEYS))
    with advantage_inputs(fresh, cfg, global_step=cfg.warmup_steps):
        return compute_advantage(fresh, adv_estimator="mrtpo", config=algo).batch["advantages"]


def main() -> None:
    console = Console()
    data = build_batch()
    gdpo, mrtpo = advantages(data, "gdpo"), advantages(data, "mrtpo")
    console.print(f"[bold]Question:[/bold] {QUESTION}   rewards: {', '.join(REWARD_KEYS)}   β = 0.5 (after warm-up)")
    for j, (text, rewards) in enumerate(GROUP):
        table = Table(title=f"response {j + 1}: rewards {rewards}", show_lines=False)
        table.add_column("token")
        table.add_column("GDPO", justify="right")
        table.add_column("MRTPO", justify="right")
        for t, token in enumerate(tokenize(text)):
            table.add_row(token, f"{gdpo[j, t]:+.3f}", f"{mrtpo[j, t]:+.3f}")
        table.caption = f"total: GDPO {gdpo[j].sum():+.2f} = MRTPO {mrtpo[j].sum():+.2f}"
        console.print(table)


if __name__ == "__main__":
    main()

"""Turn a scored, replayed batch into :class:`ResponseView` records (for the page and for dumps)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mrtpo_verl.credit.html_page import ResponseView

if TYPE_CHECKING:  # types only: reading and rendering dumps needs neither verl nor torch
    from verl.protocol import DataProto

    from mrtpo_verl.credit.token_credit import TokenCredit

__all__ = ["read_views", "views_from_batch", "write_views"]


def _prompt_text(data: DataProto, row: int, tokenizer: Any) -> str:
    raw = data.non_tensor_batch.get("raw_prompt")
    if raw is not None:
        messages = list(raw[row])
        users = [m["content"] for m in messages if m.get("role") == "user"]
        return str(users[-1] if users else messages[-1]["content"])
    prompts = data.batch["prompts"][row]
    mask = data.batch["attention_mask"][row, : prompts.shape[0]].bool()
    return str(tokenizer.decode(prompts[mask].tolist(), skip_special_tokens=True))


def _shown_rewards(data: DataProto, row: int, reward_keys: Sequence[str], info_keys: Sequence[str]) -> list[str]:
    """The rewards that concern this response: those with verifier information (a family's own keys)."""
    shown = [
        k
        for k, i in zip(reward_keys, info_keys, strict=True)
        if i not in data.non_tensor_batch or str(data.non_tensor_batch[i][row])
    ]
    return shown or list(reward_keys)


def views_from_batch(
    data: DataProto,
    credit: TokenCredit,
    tokenizer: Any,
    reward_keys: Sequence[str],
    info_keys: Sequence[str],
    labels: Sequence[str] | None = None,
) -> list[ResponseView]:
    """One view per response, in batch order, grouped by ``uid``."""
    mask = data.batch["response_mask"].bool()
    index = {k: j for j, k in enumerate(reward_keys)}
    views = []
    for row in range(len(data)):
        n = int(mask[row].sum())
        ids = data.batch["responses"][row][mask[row]].tolist()
        shown = _shown_rewards(data, row, reward_keys, info_keys)
        views.append(
            ResponseView(
                group=str(data.non_tensor_batch["uid"][row]),
                prompt=_prompt_text(data, row, tokenizer),
                tokens=[tokenizer.decode([t]) for t in ids],
                rewards={k: float(data.non_tensor_batch[k][row]) for k in shown},
                label=labels[row] if labels is not None else f"response {row + 1}",
                gdpo_total=credit.gdpo[row, :n].tolist(),
                mrtpo_total=credit.mrtpo[row, :n].tolist(),
                gdpo_by_reward={k: credit.gdpo_per_reward[row, index[k], :n].tolist() for k in shown},
                mrtpo_by_reward={k: credit.mrtpo_per_reward[row, index[k], :n].tolist() for k in shown},
            )
        )
    return views


def write_views(path: Path, views: Sequence[ResponseView], meta: dict[str, Any]) -> None:
    """A dump file: one JSON line of run facts, then one line per response."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"meta": meta})] + [json.dumps(v.to_json()) for v in views]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_views(path: Path) -> tuple[dict[str, Any], list[ResponseView]]:
    """Read a dump written by :func:`write_views`; a clear error for anything else."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines or "meta" not in json.loads(lines[0]):
        raise ValueError(f"{path}: not an mrtpo token-credit dump (first line must be {{'meta': ...}})")
    try:
        views = [ResponseView(**json.loads(line)) for line in lines[1:]]
    except TypeError as error:
        raise ValueError(f"{path}: a line is not a response view: {error}") from error
    return json.loads(lines[0])["meta"], views

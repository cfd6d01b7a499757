"""A self-contained HTML page: each response's tokens shaded by each reward's advantage, GDPO | MRTPO.

The page needs no network and no script: inline CSS, one table per response whose rows are the
total advantage and each reward's credit, and whose two columns are GDPO (uniform) and MRTPO
(moved by relevance). Colour: green for positive credit, red for negative, intensity relative to
the largest magnitude in that row pair, so the two methods of one row are directly comparable.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ResponseView", "render_page"]


@dataclass
class ResponseView:
    """What the page shows of one response (JSON-friendly, so runs can dump and re-render it).

    Attributes:
        group: the prompt's id.
        prompt: the prompt text (last user turn).
        tokens: the response's tokens as text, one per response position.
        rewards: reward key → value.
        label: e.g. "sample 2" or "reference answer".
        gdpo_total / mrtpo_total: (T,) final advantages.
        gdpo_by_reward / mrtpo_by_reward: reward key → (T,) credit of that reward.
    """

    group: str
    prompt: str
    tokens: list[str]
    rewards: dict[str, float]
    label: str
    gdpo_total: list[float]
    mrtpo_total: list[float]
    gdpo_by_reward: dict[str, list[float]] = field(default_factory=dict)
    mrtpo_by_reward: dict[str, list[float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
.prompt { white-space: pre-wrap; background: #f4f4f4; padding: 8px; border-radius: 4px; font-size: 13px; }
table.credit { border-collapse: collapse; margin: 8px 0 18px 0; width: 100%; table-layout: fixed; }
table.credit td, table.credit th { border: 1px solid #ddd; padding: 4px 6px; vertical-align: top; font-size: 13px; }
table.credit th { background: #fafafa; text-align: left; }
td.row-name { width: 150px; font-family: monospace; }
.tok { font-family: monospace; white-space: pre-wrap; border-radius: 2px; }
.legend span { display: inline-block; width: 46px; text-align: center; font-size: 12px; padding: 2px 0; }
.meta { font-size: 13px; color: #555; }
"""


def _colour(value: float, scale: float) -> str:
    if scale <= 0 or value == 0:
        return "transparent"
    strength = min(1.0, abs(value) / scale)
    hue = "0, 150, 60" if value > 0 else "210, 40, 40"
    return f"rgba({hue}, {0.08 + 0.72 * strength:.3f})"


def _shaded(tokens: Sequence[str], values: Sequence[float], scale: float) -> str:
    spans = []
    for token, value in zip(tokens, values, strict=True):
        text = html.escape(token.replace("\n", "↵\n"))
        spans.append(f'<span class="tok" style="background:{_colour(value, scale)}" title="{value:+.3f}">{text}</span>')
    return "".join(spans)


def _row(name: str, tokens: Sequence[str], gdpo: Sequence[float], mrtpo: Sequence[float]) -> str:
    scale = max([abs(v) for v in (*gdpo, *mrtpo)] or [0.0])
    return (
        f'<tr><td class="row-name">{html.escape(name)}</td><td>{_shaded(tokens, gdpo, scale)}</td>'
        f"<td>{_shaded(tokens, mrtpo, scale)}</td></tr>"
    )


def _legend() -> str:
    steps = [-1.0, -0.6, -0.3, 0.0, 0.3, 0.6, 1.0]
    cells = "".join(f'<span style="background:{_colour(s, 1.0)}">{s:+.1f}</span>' for s in steps)
    return (
        f'<p class="legend">Legend (credit relative to the largest in its row): {cells} '
        "— green: the token is credited, red: blamed. Hover a token for its value.</p>"
    )


def render_page(title: str, views: Sequence[ResponseView], reward_keys: Sequence[str], meta: dict[str, Any]) -> str:
    """The whole page as a string.

    Args:
        title: page title.
        views: responses in display order (grouped by ``group``).
        reward_keys: the rewards, in order; a reward absent from a response's credit is not shown for it.
        meta: run facts shown at the top (model, β, step, ...).
    """
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>",
    ]
    facts = ", ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in meta.items())
    parts.append(f'<p class="meta">{facts}</p>{_legend()}')
    current_group = None
    for view in views:
        if view.group != current_group:
            current_group = view.group
            parts.append(f"<h2>{html.escape(view.group)}</h2><div class='prompt'>{html.escape(view.prompt)}</div>")
        rewards = ", ".join(f"{k} = {v:g}" for k, v in view.rewards.items())
        parts.append(f"<p><b>{html.escape(view.label)}</b> — {html.escape(rewards)}</p>")
        parts.append('<table class="credit"><tr><th class="row-name"></th><th>GDPO</th><th>MRTPO</th></tr>')
        parts.append(_row("total advantage", view.tokens, view.gdpo_total, view.mrtpo_total))
        for key in reward_keys:
            if key in view.gdpo_by_reward:
                parts.append(_row(key, view.tokens, view.gdpo_by_reward[key], view.mrtpo_by_reward[key]))
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)

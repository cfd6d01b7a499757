"""Prompt groups that reach the advantage step without all of their ``rollout.n`` responses.

How verl 0.9.1's v1 trainers form a training batch (``verl/trainer/ppo/v1/replay_buffer.py``):

- The replay buffer samples *prompt* uids whose status is terminal (``finished`` or ``failure``)
  and materialises every trajectory key ``{uid}_{session}_{index}`` of those uids. A prompt turns
  terminal only after all of its ``rollout.n`` sessions settled (``agent_loop_tq._run_prompt``),
  so partial rollouts (``colocate_async``/``separate_async`` abort and resume) never hand a group
  over half-generated; the group's responses may just span several weight versions.
- ``separate_async`` samples ``train_batch_size / parameter_sync_step`` prompts per mini-step and
  runs the advantage once per mini-step: each mini-batch holds whole groups, and the batch
  whitening statistics are the mini-batch's.
- ``_balance_batch`` reorders rows and may append synthetic padding rows (tag ``is_padding``, a
  fresh ``pad...`` uid): they are not a prompt group and are skipped here.

Groups can still arrive incomplete: in ``sync`` mode a ``failure`` group stays sampleable with the
sessions that failed missing; an agent loop that returns no output leaves no trajectory for its
session while the prompt still counts as ``finished``; a custom sampler may select keys freely.

verl's own ``grpo``/``gdpo`` (``compute_grpo_outcome_advantage``) normalise every uid over the rows
it has, whatever their number; a uid with a single row gets mean 0 and std 1, i.e.
``Â = r / (1 + ε)``. ``mrtpo`` computes ``Â_k`` with that same function, so with
``mrtpo.on_incomplete_group=normalise`` (the default) such groups are trained exactly as verl trains
them, and with ``error`` the step stops with the groups named. Either way :func:`find_incomplete_groups`
counts them for the step's metrics and the log.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mrtpo_verl.compat.transfer_queue import is_padding_row, row_key_parts

__all__ = [
    "IncompleteGroupError",
    "IncompleteGroups",
    "check_whole_groups",
    "find_incomplete_groups",
    "lenient_message",
    "padding_rows",
    "strict_message",
]

#: Incomplete groups named in a message; the rest are counted.
NAMED_GROUPS = 3


class IncompleteGroupError(RuntimeError):
    """A prompt group (uid) reached the advantage step without all of its ``rollout.n`` sessions."""


@dataclass(frozen=True)
class IncompleteGroups:
    """The prompt groups of one batch whose sessions are not exactly ``0 .. n-1``.

    Attributes:
        n: ``actor_rollout_ref.rollout.n``.
        groups: number of prompt groups in the batch (padding left out).
        sessions: uid → the session ids present, for the incomplete groups only (batch order).
        rows: uid → number of batch rows of that group, for the incomplete groups only.
    """

    n: int
    groups: int
    sessions: dict[str, set[int]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.sessions)

    @property
    def row_count(self) -> int:
        return sum(self.rows.values())

    @property
    def single_response_rows(self) -> int:
        """Rows alone in their group: verl's rule gives them ``Â = r / (1 + ε)``, no group comparison."""
        return sum(count for count in self.rows.values() if count == 1)

    def metrics(self) -> dict[str, float]:
        """``mrtpo/groups/...``: incomplete groups, their rows, and the rows that are alone in their group."""
        return {
            "mrtpo/groups/incomplete": float(len(self.sessions)),
            "mrtpo/groups/incomplete_rows": float(self.row_count),
            "mrtpo/groups/single_response_rows": float(self.single_response_rows),
        }

    def describe(self) -> str:
        """The first incomplete groups: sessions present, missing, and beyond ``rollout.n``."""
        expected = set(range(self.n))
        named = []
        for uid, found in list(self.sessions.items())[:NAMED_GROUPS]:
            text = f"uid {uid!r}: sessions {sorted(found)} present, {sorted(expected - found)} missing"
            if found - expected:
                text += f", {sorted(found - expected)} beyond rollout.n"
            named.append(text)
        more = len(self.sessions) - len(named)
        return "; ".join(named) + (f"; and {more} more" if more > 0 else "")


def padding_rows(tags: Sequence[dict[str, Any]]) -> list[bool]:
    """Per row: True for verl's synthetic padding samples (``upsample_batch_to_divisible_size``)."""
    return [is_padding_row(tag) for tag in tags]


def find_incomplete_groups(keys: Sequence[str], tags: Sequence[dict[str, Any]], n: int) -> IncompleteGroups:
    """The non-padding uids of the batch that do not hold exactly sessions ``0 .. n-1``.

    Args:
        keys: TransferQueue keys ``{uid}_{session_id}_{index}`` of the batch rows.
        tags: the rows' TransferQueue tags (same order), for ``is_padding``.
        n: ``actor_rollout_ref.rollout.n``.

    Raises:
        IncompleteGroupError: a key that is not verl's ``{uid}_{session_id}_{index}``.
    """
    sessions: dict[str, set[int]] = defaultdict(set)
    rows: dict[str, int] = defaultdict(int)
    for key, is_padding in zip(keys, padding_rows(tags), strict=True):
        if is_padding:
            continue
        try:
            uid, session = row_key_parts(key)
        except ValueError as error:
            raise IncompleteGroupError(f"mrtpo: {error}") from error
        sessions[uid].add(session)
        rows[uid] += 1
    expected = set(range(n))
    broken = [uid for uid, found in sessions.items() if found != expected]
    return IncompleteGroups(
        n=n,
        groups=len(sessions),
        sessions={uid: sessions[uid] for uid in broken},
        rows={uid: rows[uid] for uid in broken},
    )


def check_whole_groups(keys: Sequence[str], tags: Sequence[dict[str, Any]], n: int, mode: str) -> None:
    """Every non-padding uid of the batch must hold sessions ``0 .. n-1`` (``on_incomplete_group=error``).

    Args:
        keys: TransferQueue keys ``{uid}_{session_id}_{index}`` of the batch rows.
        tags: the rows' TransferQueue tags (same order), for ``is_padding``.
        n: ``actor_rollout_ref.rollout.n``.
        mode: the trainer mode, for the message.

    Raises:
        IncompleteGroupError: naming the first incomplete uids, the sessions present and missing.
    """
    incomplete = find_incomplete_groups(keys, tags, n)
    if incomplete:
        raise IncompleteGroupError(strict_message(incomplete, mode))


def strict_message(incomplete: IncompleteGroups, mode: str) -> str:
    """Why the step stops under ``mrtpo.on_incomplete_group=error``, with the groups and the way out."""
    return (
        f"mrtpo: {len(incomplete.sessions)} of {incomplete.groups} prompt group(s) ({incomplete.row_count} rows) in "
        f"this {mode} training batch are incomplete (rollout.n={incomplete.n}): {incomplete.describe()}. "
        "mrtpo.on_incomplete_group=error stops the step; mrtpo.on_incomplete_group=normalise normalises each group "
        "over the responses present, as verl's gdpo/grpo do. Typical causes: a rollout session failed or returned "
        "no output (verl's sync replay buffer keeps such groups), a per-prompt __rollout_n__ different from "
        "rollout.n, or a custom sampler that selects trajectory keys instead of whole prompt groups"
    )


def lenient_message(incomplete: IncompleteGroups, mode: str) -> str:
    """The warning logged under ``mrtpo.on_incomplete_group=normalise``."""
    return (
        f"mrtpo: {len(incomplete.sessions)} of {incomplete.groups} prompt group(s) ({incomplete.row_count} rows, "
        f"{incomplete.single_response_rows} alone in their group) in this {mode} training batch are incomplete "
        f"(rollout.n={incomplete.n}): {incomplete.describe()}. Each is normalised over the responses present, as "
        "verl's gdpo/grpo do (a lone response gets mean 0, std 1); set mrtpo.on_incomplete_group=error to stop instead"
    )

"""GDPO/MRTPO group statistics need every response of a prompt group in the batch: check it.

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
Normalising over such a group would silently change ``mean_g``/``std_g``, so the step fails with
the group named instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

__all__ = ["IncompleteGroupError", "check_whole_groups", "padding_rows"]


class IncompleteGroupError(RuntimeError):
    """A prompt group (uid) reached the advantage step without all of its ``rollout.n`` sessions."""


def padding_rows(tags: Sequence[dict[str, Any]]) -> list[bool]:
    """Per row: True for verl's synthetic padding samples (``upsample_batch_to_divisible_size``)."""
    return [bool((tag or {}).get("is_padding", False)) for tag in tags]


def check_whole_groups(keys: Sequence[str], tags: Sequence[dict[str, Any]], n: int, mode: str) -> None:
    """Every non-padding uid of the batch must hold sessions ``0 .. n-1``.

    Args:
        keys: TransferQueue keys ``{uid}_{session_id}_{index}`` of the batch rows.
        tags: the rows' TransferQueue tags (same order), for ``is_padding``.
        n: ``actor_rollout_ref.rollout.n``.
        mode: the trainer mode, for the message.

    Raises:
        IncompleteGroupError: naming the first incomplete uids, the sessions present and missing.
    """
    sessions: dict[str, set[int]] = defaultdict(set)
    for key, is_padding in zip(keys, padding_rows(tags), strict=True):
        if is_padding:
            continue
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            raise IncompleteGroupError(f"mrtpo: row key {key!r} is not verl's '{{uid}}_{{session_id}}_{{index}}'")
        sessions[parts[0]].add(int(parts[1]))
    expected = set(range(n))
    broken = {uid: found for uid, found in sessions.items() if found != expected}
    if not broken:
        return
    described = "; ".join(
        f"uid {uid!r}: sessions {sorted(found)} present, {sorted(expected - found)} missing"
        + (f", {sorted(found - expected)} beyond rollout.n" if found - expected else "")
        for uid, found in list(broken.items())[:3]
    )
    raise IncompleteGroupError(
        f"mrtpo: {len(broken)} of {len(sessions)} prompt group(s) in this {mode} training batch are incomplete "
        f"(rollout.n={n}): {described}. Group-normalised rewards (gdpo, mrtpo) would be computed over a partial "
        "group, so the step stops. Typical causes: a rollout session failed or returned no output (verl's sync "
        "replay buffer keeps such groups), a per-prompt __rollout_n__ different from rollout.n, or a custom "
        "sampler that selects trajectory keys instead of whole prompt groups"
    )

"""Tool-calling verifier: BFCL-style function-call checking as two reward components.

``compute_score`` returns ``tool_format`` (0/1), ``tool_correctness`` ([0, 1],
continuous), ``score`` (their mean) and one verifier-information string per
component. Ground-truth forms are described in ``reference``, the response
format in ``parse``, the scoring formula in ``match``.
"""

from reward_fns.tool_calling.verifier import REWARD_KEYS, compute_score

DATA_SOURCES: tuple[str, ...] = ("bfcl", "toolrl", "tool_calling")

__all__ = ["DATA_SOURCES", "REWARD_KEYS", "compute_score"]

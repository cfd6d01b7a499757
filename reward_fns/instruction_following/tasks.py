"""The instruction-following work a pool worker runs, as plain-data tasks (``TASKS``).

Importing this module loads both checker libraries (and NLTK's Punkt model), so a worker
is ready only once a check can start at once: the deadline never pays for imports.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from reward_fns.instruction_following.checkers import UNSUPPORTED, UnsupportedConstraintError, checker_registry
from reward_fns.instruction_following.data import BENCHMARK_FILES, load_benchmark, parse_ground_truth
from reward_fns.instruction_following.verifier import score_response

checker_registry()

WARM_UP_RESPONSE = "Hello world. This is a short answer, with a comma.\n\nP.S. Done."


def warm_up() -> None:
    """Checks a short answer once against one constraint of every supported instruction id.

    Run by the pool's zygote before it forks (see ``reward_fns.process_pool.zygote``): the loads a
    first check makes lazily (NLTK's tokenizers: about 0.1 s in all) then happen once, not in
    every worker. A check that raises here is left to raise again on a real answer.
    """
    seen: set[str] = set()
    for benchmark in BENCHMARK_FILES:
        for record in load_benchmark(benchmark):
            for constraint in parse_ground_truth(record).constraints:
                if constraint.instruction_id in seen or constraint.instruction_id in UNSUPPORTED:
                    continue
                seen.add(constraint.instruction_id)
                truth = {"instruction_id_list": [constraint.instruction_id], "kwargs": [dict(constraint.kwargs)]}
                with contextlib.suppress(Exception):
                    score({**truth, "prompt": record["prompt"]}, WARM_UP_RESPONSE, 1)


def score(ground_truth: dict[str, Any], response: str, max_constraints: int) -> dict[str, Any]:
    """``{"scores": reward dict}``, or ``{"unsupported": message}`` for a constraint no checker can check."""
    try:
        return {"scores": score_response(ground_truth, response, max_constraints)}
    except UnsupportedConstraintError as error:
        return {"unsupported": str(error)}


TASKS: dict[str, Callable[..., Any]] = {"score": score}

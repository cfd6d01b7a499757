"""The instruction-following reward: one component per constraint of the prompt.

MRTPO (and GDPO) need one reward per verifier with the same keys on every sample
of a batch, so a prompt's constraints are laid out in a fixed number of slots
``if_c0 .. if_c{N-1}`` (``N = max_constraints``), each with its verifier-information
string ``if_c{i}_info``.

Where a response is checked (:func:`checked_in_thread`): when its length times its prompt's number of
constraints is at most :data:`INLINE_MAX_CHECKED_CHARS`, in the calling thread; otherwise in this
family's worker pool (``reward_fns.process_pool``) under the reward's wall-clock deadline ``timeout_s``.
Several checkers take seconds on a hostile 100 KiB answer (NLTK's tokenizers on tens of thousands of
sentences, regular expressions that backtrack over long runs) and a thread cannot be stopped, but
each check is at most quadratic in the response, so a short one is bounded: see
:data:`INLINE_MAX_CHECKED_CHARS` and ``docs/reward_fns.md``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import Any

from reward_fns.instruction_following.checkers import (
    UNSUPPORTED,
    ConstraintResult,
    UnsupportedConstraintError,
    check_constraint,
    checker_registry,
)
from reward_fns.instruction_following.data import BENCHMARK_FILES, PromptConstraints, load_benchmark, parse_ground_truth
from reward_fns.process_pool.deadline import DEFAULT_TIMEOUT_S, DeadlineSettings, run_task
from reward_fns.total import VerifierFaultError, total_over_responses

TASKS_MODULE = "reward_fns.instruction_following.tasks"

INLINE_MAX_CHECKED_CHARS = 1024
"""Most characters checked in the calling thread: a response is checked there when its length times its
prompt's number of constraints is at most this. Every check's time grows at most with the square of
the response's length (linearly for all but a few regular expressions), so the sum over the
constraints is at most the slowest single check of a response this long. The slowest found over
adversarial answers for every instruction id (``python -m benchmarks.reward_throughput --tables inline``)
is NLTK word-tokenising 512 one-character sentences (IFBench's ``words:words_position`` and
``format:title_case``, IFEval's ``change_case:capital_word_frequency``), well under the default 5 s
deadline; the typical check costs less than a pool round trip (timings: docs/reward_fns.md)."""

MAX_CONSTRAINTS = 3
"""Default number of constraint slots: the most instructions any prompt has in the
packaged benchmarks (IFEval: 3, IFBench: 2). Data with more needs a larger
``max_constraints``."""

EMPTY_SLOT_SCORE = 0.0
"""Value of a slot beyond the prompt's last constraint."""

EMPTY_SLOT_INFO = ""
"""Verifier information of a slot beyond the prompt's last constraint."""

LANGUAGE_UNDETECTED_KEY = "reward/instruction_following/language_undetected"
"""Numeric counter key: 1.0 when ``langdetect`` could not place the response's language in one of its
checks (IFEval then counts that constraint as followed), else 0.0. The checkers' own log line for it,
which carries the whole answer, is dropped (:class:`.checkers.UndetectedLanguageFilter`)."""

COUNTER_KEYS = (LANGUAGE_UNDETECTED_KEY,)
"""This family's numeric counters beyond ``internal_errors`` and ``timeouts``: in every result (0.0 when
the response was not checked) and, through ``reward_fns.dispatch``, in every sample's key set."""

_SLOT_PREFIX = "if_c"


def _validate_slot_count(max_constraints: int) -> None:
    """Rejects a slot count that is not a positive int.

    Args:
        max_constraints: The requested number of slots.

    Raises:
        ValueError: It is not a positive int.
    """
    if isinstance(max_constraints, bool) or not isinstance(max_constraints, int) or max_constraints < 1:
        raise ValueError(f"max_constraints must be a positive int, got {max_constraints!r}")


def reward_keys(max_constraints: int = MAX_CONSTRAINTS) -> tuple[str, ...]:
    """Names the numeric reward components, one per constraint slot.

    Args:
        max_constraints: The number of slots.

    Returns:
        ``("if_c0", "if_c1", ...)``; the info key of each is ``f"{key}_info"``.
    """
    _validate_slot_count(max_constraints)
    return tuple(f"{_SLOT_PREFIX}{slot}" for slot in range(max_constraints))


REWARD_KEYS = reward_keys()


def _slot_count(arguments: Mapping[str, Any]) -> int:
    value = arguments.get("max_constraints")
    return MAX_CONSTRAINTS if value is None else value  # type: ignore[no-any-return]


def read_ground_truth(arguments: Mapping[str, Any]) -> PromptConstraints:
    """The constraints of a ``compute_score`` call (its arguments by name), checked against the slot count.

    Raises:
        ValueError: malformed ground truth, or more constraints than ``max_constraints`` slots.
    """
    slots = len(reward_keys(_slot_count(arguments)))
    constraints = parse_ground_truth(arguments.get("ground_truth"))  # type: ignore[arg-type]
    if len(constraints.constraints) > slots:
        raise ValueError(
            f"The prompt has {len(constraints.constraints)} instruction-following constraints but only "
            f"max_constraints={slots} reward slots; raise max_constraints (the same for every sample of a run) "
            "or drop the row"
        )
    return constraints


def keys_for(arguments: Mapping[str, Any]) -> tuple[str, ...]:
    """The reward keys of a ``compute_score`` call: one per slot of its ``max_constraints``."""
    return reward_keys(_slot_count(arguments))


@total_over_responses(
    "instruction_following",
    read_ground_truth=read_ground_truth,
    reward_keys=keys_for,
    ground_truth_errors=(UnsupportedConstraintError,),
    counters=COUNTER_KEYS,
)
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Mapping[str, Any] | str,
    extra_info: dict[str, Any] | None = None,
    max_constraints: int = MAX_CONSTRAINTS,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    isolation: str = "process",
    sandbox_workers: int | None = None,
    sandbox_memory_bytes: int | None = None,
    **kwargs: Any,
) -> dict[str, float | str]:
    """Scores a response against every constraint of its prompt.

    Slot ``i`` holds the prompt's ``i``-th constraint: ``if_c{i}`` is 1.0 when the
    response satisfies it (IFEval's strict check) and 0.0 otherwise, and
    ``if_c{i}_info`` is the constraint's own description with its arguments (e.g.
    "Answer with at least 300 words."). Slots beyond the prompt's constraints hold
    :data:`EMPTY_SLOT_SCORE` (0.0) and :data:`EMPTY_SLOT_INFO` (""). All responses of
    a group share a prompt, hence its number of constraints, so an empty slot is
    constant inside every group and can never give a non-zero group advantage.

    Args:
        data_source: The sample's data source; the dispatcher has already routed it here.
        solution_str: The decoded response.
        ground_truth: The prompt's constraints, schema in :mod:`.data` (dict or JSON string).
        extra_info: Unused; accepted for verl's reward-function signature.
        max_constraints: Number of constraint slots, the same for the whole run.
        timeout_s: Wall-clock deadline for checking a response that :func:`checked_in_thread` sends to the
            pool (all its constraints); past it the response scores 0 and
            ``reward/instruction_following/timeouts`` is 1.
        isolation: ``"process"`` (the family's worker pool; the default) or ``"inprocess"`` (no
            deadline; for measuring the pool's cost only).
        sandbox_workers: Worker processes of the pool (default ``min(32, os.cpu_count() + 4)``).
        sandbox_memory_bytes: Address-space limit of each worker.
        **kwargs: Unused; accepted for verl's reward-function signature.

    Returns:
        ``"score"`` (the fraction of the prompt's constraints satisfied: IFEval's
        instruction-level strict accuracy for this prompt), :data:`LANGUAGE_UNDETECTED_KEY`, then
        ``if_c{i}`` and ``if_c{i}_info`` for every slot.

    Raises:
        ValueError: Malformed ground truth, or a prompt with more constraints than
            ``max_constraints``.
        UnsupportedConstraintError: A constraint the checker libraries cannot check
            faithfully (see ``checkers.UNSUPPORTED``).
        reward_fns.total.VerifierFaultError: The checker libraries or their data cannot be loaded
            (in this process for a short response, in the pool's workers for a long one).
    """
    settings = DeadlineSettings.from_kwargs(timeout_s, isolation, sandbox_workers, sandbox_memory_bytes)
    prompt_constraints = parse_ground_truth(ground_truth)
    plain = {
        "instruction_id_list": [constraint.instruction_id for constraint in prompt_constraints.constraints],
        "kwargs": [dict(constraint.kwargs) for constraint in prompt_constraints.constraints],
        "prompt": prompt_constraints.prompt,
    }
    request = {"ground_truth": plain, "response": solution_str, "max_constraints": max_constraints}
    if checked_in_thread(solution_str, len(prompt_constraints.constraints)):
        load_checkers_here()
        return score_response(plain, solution_str, max_constraints)
    outcome = run_task(TASKS_MODULE, "instruction-following", "score", request, settings)
    if "unsupported" in outcome:
        raise UnsupportedConstraintError(outcome["unsupported"])
    return outcome["scores"]  # type: ignore[no-any-return]


def checked_in_thread(response: Any, constraint_count: int) -> bool:
    """Whether a response is checked in the calling thread: its length times the prompt's number of
    constraints is at most :data:`INLINE_MAX_CHECKED_CHARS` (a non-string goes to the pool)."""
    return isinstance(response, str) and len(response) * max(1, constraint_count) <= INLINE_MAX_CHECKED_CHARS


_load_lock = threading.Lock()
_loaded_here = threading.Event()


def load_checkers_here() -> None:
    """Loads the checker libraries into this process once, as the pool's zygote does for its workers.

    The first call imports both libraries, writes NLTK's Punkt model if it is missing and checks a short
    answer against every instruction id (NLTK's lazy loads); concurrent first calls wait for it.

    Raises:
        reward_fns.total.VerifierFaultError: A library or its data cannot be loaded; raised on every call
            until one succeeds, never scored as 0.
    """
    if _loaded_here.is_set():
        return
    with _load_lock:
        if _loaded_here.is_set():
            return
        try:
            checker_registry()
        except Exception as error:
            raise VerifierFaultError(
                "reward_fns.instruction_following: the checker libraries cannot be loaded in the reward "
                f"process ({type(error).__name__}: {error}); this is a fault of the verifier's installation "
                "or data, not of the responses"
            ) from error
        warm_up()
        _loaded_here.set()


WARM_UP_RESPONSE = "Hello world. This is a short answer, with a comma.\n\nP.S. Done."


def warm_up() -> None:
    """Checks a short answer once against one constraint of every supported instruction id.

    Run once by the pool's zygote before it forks (``reward_fns.process_pool.zygote``) and once by
    :func:`load_checkers_here` in the reward process: the loads a first check makes lazily (NLTK's
    tokenizers) then happen once, in one thread. A check that raises here is left
    to raise again on a real answer.
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
                    score_response({**truth, "prompt": record["prompt"]}, WARM_UP_RESPONSE, 1)


def score_response(ground_truth: Mapping[str, Any], response: str, max_constraints: int) -> dict[str, float | str]:
    """The reward dict of one response, computed here (the worker's task; see :func:`compute_score`).

    Raises:
        UnsupportedConstraintError: a constraint no checker can check faithfully.
    """
    keys = reward_keys(max_constraints)
    prompt_constraints = parse_ground_truth(ground_truth)
    constraint_count = len(prompt_constraints.constraints)
    if constraint_count > max_constraints:
        raise ValueError(
            f"The prompt has {constraint_count} instruction-following constraints but only "
            f"max_constraints={max_constraints} reward slots; raise the max_constraints option "
            f"to at least {constraint_count} (it must be the same for every sample of a run)."
        )
    results = [
        check_constraint(constraint.instruction_id, constraint.kwargs, prompt_constraints.prompt, response)
        for constraint in prompt_constraints.constraints
    ]
    return _layout(results, keys)


def _layout(results: list[ConstraintResult], keys: tuple[str, ...]) -> dict[str, float | str]:
    """Puts the constraint verdicts into the fixed slots.

    Args:
        results: One verdict per constraint, in ground-truth order.
        keys: The slot keys; at least as many as results.

    Returns:
        The reward dict: score and the language counter first, then each slot's value and info.
    """
    scores: dict[str, float | str] = {"score": sum(result.followed for result in results) / len(results)}
    scores[LANGUAGE_UNDETECTED_KEY] = 1.0 if any(result.language_undetected for result in results) else 0.0
    for slot, key in enumerate(keys):
        if slot < len(results):
            scores[key] = 1.0 if results[slot].followed else 0.0
            scores[f"{key}_info"] = results[slot].description
        else:
            scores[key] = EMPTY_SLOT_SCORE
            scores[f"{key}_info"] = EMPTY_SLOT_INFO
    return scores

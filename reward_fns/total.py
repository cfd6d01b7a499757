"""Reward functions that no response can take down: total over responses, strict about ground truth.

The rules in full: ``docs/reward_fns.md`` (``reward_fns/total.py``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_RESPONSE_CHARS",
    "GroundTruthError",
    "ResponseTimeout",
    "RewardConfigError",
    "VerifierFaultError",
    "internal_error_counts",
    "internal_errors_key",
    "row_label",
    "timeouts_key",
    "total_over_responses",
]

MAX_RESPONSE_CHARS = 256 * 1024
"""Longest response (in code points) any verifier reads; longer ones score 0 unread. Far above
what a policy writes within verl's ``max_response_length`` (a token is rarely more than ~10 chars),
and small enough that every parser finishes in well under a second."""

MAX_INTERNAL_ERRORS_IN_A_ROW = 64
"""Internal errors of one family on this many responses in a row, none scored in between, stop the
run: a hostile response breaks one call, a verifier bug breaks them all."""

_ERROR_TEXT_LIMIT = 300

_lock = threading.Lock()
_error_counts: Counter[str] = Counter()
_errors_in_a_row: Counter[str] = Counter()
_logged_sites: set[tuple[str, str, str, int]] = set()


class GroundTruthError(ValueError):
    """A row's ground truth cannot be read by its family's verifier (a data error, not a response's)."""


class RewardConfigError(ValueError):
    """A reward setting (a ``reward_kwargs`` entry) that the family refuses: raised, never scored as 0."""


class VerifierFaultError(RuntimeError):
    """The verifier itself cannot work (no worker can start, workers keep dying, a bug on every call).

    Raised through ``compute_score`` so that the run stops with this message: no response is to blame
    and a 0 for every response would train on nothing.
    """


class ResponseTimeout(Exception):
    """Checking the response ran past the family's wall-clock deadline (the response's doing: scores 0)."""


def internal_errors_key(family: str) -> str:
    """The numeric reward key counting a family's internal errors: ``reward/<family>/internal_errors``."""
    return f"reward/{family}/internal_errors"


def timeouts_key(family: str) -> str:
    """The numeric reward key marking a response that ran past the deadline: ``reward/<family>/timeouts``."""
    return f"reward/{family}/timeouts"


def internal_error_counts() -> dict[str, int]:
    """Internal errors per family in this process since start (or the last :func:`reset_internal_errors`)."""
    with _lock:
        return dict(_error_counts)


def reset_internal_errors() -> None:
    """Forget the counts and which sites were logged (for tests)."""
    with _lock:
        _error_counts.clear()
        _errors_in_a_row.clear()
        _logged_sites.clear()


def row_label(data_source: Any, extra_info: Mapping[str, Any] | None) -> str:
    """``data_source='spider', row index=12 (split 'train')`` for error messages."""
    info = extra_info if isinstance(extra_info, Mapping) else {}
    index = info.get("index", "unknown (extra_info has no 'index')")
    split = f" (split {info['split']!r})" if "split" in info else ""
    return f"data_source={data_source!r}, row index={index}{split}"


@functools.cache
def _ground_truth_error_type(original: type[Exception]) -> type[GroundTruthError]:
    """``GroundTruthError`` that is also the original type, so ``except FileNotFoundError`` still works."""
    if issubclass(original, GroundTruthError):
        return original
    try:
        return type(f"GroundTruthError[{original.__name__}]", (GroundTruthError, original), {})
    except TypeError:  # incompatible layouts (e.g. an extension type): the plain class will do
        return GroundTruthError


def _named_ground_truth_error(family: str, arguments: Mapping[str, Any], error: Exception) -> GroundTruthError:
    """The reader's error, same type, with a message that names the row."""
    label = row_label(arguments.get("data_source"), arguments.get("extra_info"))
    message = f"{family}: the ground truth of {label} cannot be used: {error}"
    try:
        return _ground_truth_error_type(type(error))(message)
    except Exception:
        return GroundTruthError(message)


GroundTruthReader = Callable[[Mapping[str, Any]], Any]
"""A family's ground-truth reader: takes ``compute_score``'s arguments by name, raises on a bad row."""

KeysOf = Callable[[Mapping[str, Any]], tuple[str, ...]]
"""A family's reward keys for ``compute_score``'s arguments (the slot count may be one of them)."""


def _read_ground_truth_or_raise(family: str, reader: GroundTruthReader, arguments: Mapping[str, Any]) -> None:
    try:
        reader(arguments)
    except RewardConfigError:
        raise  # a setting, not this row's data
    except Exception as error:
        raise _named_ground_truth_error(family, arguments, error) from error


def _zero_result(
    family: str, keys: tuple[str, ...], info: str, *, internal_error: bool = False, timeout: bool = False
) -> dict[str, Any]:
    result: dict[str, Any] = {"score": 0.0}
    for key in keys:
        result[key] = 0.0
        result[f"{key}_info"] = info
    result[internal_errors_key(family)] = 1.0 if internal_error else 0.0
    result[timeouts_key(family)] = 1.0 if timeout else 0.0
    return result


def _record_success(family: str) -> None:
    with _lock:
        _errors_in_a_row[family] = 0


def _record_internal_error(family: str, error: BaseException) -> None:
    """Count the error; log it with its traceback the first time its (family, type, line) is seen.

    Raises:
        VerifierFaultError: the family failed on `MAX_INTERNAL_ERRORS_IN_A_ROW` responses in a row.
    """
    frames = traceback.extract_tb(error.__traceback__)
    last = frames[-1] if frames else None
    site = (family, type(error).__name__, last.filename if last else "?", (last.lineno or 0) if last else 0)
    with _lock:
        _error_counts[family] += 1
        _errors_in_a_row[family] += 1
        in_a_row = _errors_in_a_row[family]
        first = site not in _logged_sites
        _logged_sites.add(site)
    if in_a_row >= MAX_INTERNAL_ERRORS_IN_A_ROW:
        raise VerifierFaultError(
            f"reward_fns.{family}: the verifier failed internally on {in_a_row} responses in a row, the last "
            f"with {type(error).__name__}: {error}; this is a fault of the verifier, not of the responses\n"
            + _short_traceback(error)
        ) from error
    if first:
        logger.error(
            "reward_fns.%s: internal error scored as 0 (logged once per site; counted in %s)\n%s",
            family,
            internal_errors_key(family),
            _short_traceback(error),
        )


def _short_traceback(error: BaseException, head: int = 15, tail: int = 10) -> str:
    """The traceback, with the middle of a deep one (a RecursionError's thousand frames) left out."""
    frames = traceback.extract_tb(error.__traceback__)
    if len(frames) > head + tail:
        kept = traceback.StackSummary.from_list([*frames[:head], *frames[-tail:]]).format()
        lines = [*kept[:head], f"  ... {len(frames) - head - tail} frames left out ...\n", *kept[head:]]
    else:
        lines = traceback.StackSummary.from_list(frames).format()
    return "Traceback (most recent call last):\n" + "".join(lines) + f"{type(error).__name__}: {error}"


def _checked(family: str, result: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The family's result with the counter added, after checking keys and finiteness."""
    if not isinstance(result, Mapping):
        raise TypeError(f"compute_score returned {type(result).__name__}, not a dict")
    missing = [key for key in ("score", *keys, *(f"{k}_info" for k in keys)) if key not in result]
    if missing:
        raise KeyError(f"compute_score result lacks {missing}")
    checked = dict(result)
    for key in ("score", *keys):
        value = float(checked[key])
        if not math.isfinite(value):
            raise ValueError(f"compute_score returned a non-finite {key} = {value}")
        checked[key] = value
    checked[internal_errors_key(family)] = 0.0
    checked[timeouts_key(family)] = float(bool(checked.get(timeouts_key(family), 0.0)))
    return checked


def total_over_responses(
    family: str,
    *,
    read_ground_truth: GroundTruthReader,
    reward_keys: KeysOf,
    ground_truth_errors: tuple[type[Exception], ...] = (),
    counters: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., dict[str, Any]]]:
    """Decorate a family's ``compute_score`` to be total over responses (see the module docstring).

    Args:
        family: the family name (``text_to_sql``, ``tool_calling``, ``instruction_following``).
        read_ground_truth: the family's reader, run on every call before the scorer.
        reward_keys: the family's reward keys for the call's arguments.
        ground_truth_errors: error types that, raised while scoring, mean the ground truth is unusable
            whatever the response (an instruction id no checker implements).
        counters: the family's own numeric counter keys; 0.0 in every result that lacks them (a response
            refused, timed out or failed internally), so every call returns the same key set.

    Returns:
        The decorator. The wrapped function takes the same arguments and returns the family's keys
        plus ``reward/<family>/internal_errors`` and ``reward/<family>/timeouts``.
    """

    def decorate(compute_score: Callable[..., Any]) -> Callable[..., dict[str, Any]]:
        signature = inspect.signature(compute_score)

        @functools.wraps(compute_score)
        def total_compute_score(*args: Any, **kwargs: Any) -> dict[str, Any]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = {
                name: value
                for name, value in bound.arguments.items()
                if signature.parameters[name].kind is not inspect.Parameter.VAR_KEYWORD
            }
            arguments.update(bound.kwargs)
            _read_ground_truth_or_raise(family, read_ground_truth, arguments)
            keys = reward_keys(arguments)
            response = arguments.get("solution_str")
            if isinstance(response, str) and len(response) > MAX_RESPONSE_CHARS:
                info = f"Response refused unread: {len(response):,} characters, over the {MAX_RESPONSE_CHARS:,} cap."
                return _zero_result(family, keys, info)
            try:
                result = _checked(family, compute_score(*args, **kwargs), keys)
            except (RewardConfigError, VerifierFaultError):
                raise
            except ResponseTimeout as timeout:
                _record_success(family)  # the verifier worked: the response ran out of time
                return _zero_result(family, keys, f"Verifier deadline: {timeout}; the response scored 0.", timeout=True)
            except Exception as error:
                if isinstance(error, ground_truth_errors):
                    raise _named_ground_truth_error(family, arguments, error) from error
                _record_internal_error(family, error)
                text = f"{type(error).__name__}: {error}"[:_ERROR_TEXT_LIMIT]
                info = f"Verifier internal error ({text}); the response scored 0."
                return _zero_result(family, keys, info, internal_error=True)
            _record_success(family)
            return result

        if not counters:
            return total_compute_score

        @functools.wraps(compute_score)
        def total_compute_score_with_counters(*args: Any, **kwargs: Any) -> dict[str, Any]:
            result = total_compute_score(*args, **kwargs)
            for key in counters:
                result[key] = float(result.get(key, 0.0))
            return result

        return total_compute_score_with_counters

    return decorate

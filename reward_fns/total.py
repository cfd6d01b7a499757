"""Reward functions that no response can take down: total over responses, strict about ground truth.

verl 0.9.1's reward managers call ``compute_score`` without a try/except, so one exception ends
(or stalls) a run that may have been going for days. :func:`total_over_responses` wraps a family's
``compute_score`` so that:

* a ground truth the family cannot read raises :class:`GroundTruthError`, naming ``data_source`` and
  the row's ``extra_info["index"]``: a data error, never a silent 0;
* a reward setting the family refuses (``reward_kwargs`` such as an unknown ``semantics`` or
  ``isolation``) raises :class:`RewardConfigError`: a configuration error, never a silent 0 on
  every sample;
* anything a *response* triggers inside the verifier (a ``RecursionError`` in a parser, a checker
  bug, a non-finite score) becomes score 0 with every component 0, the error in every verifier
  information string, ``reward/<family>/internal_errors`` = 1.0 for that sample, one log record with
  the traceback per (family, exception type, raising line) and a process-wide count
  (:func:`internal_error_counts`);
* a response longer than :data:`MAX_RESPONSE_CHARS` is refused (all components 0) before any parser
  sees it.

Every call returns the family's fixed key set: ``score``, each reward key, each ``<key>_info`` and
the numeric ``reward/<family>/internal_errors`` (0.0 or 1.0). verl keeps every extra key of the
reward dict; numeric ones become validation metrics (``val-aux/<data_source>/<key>/mean@N``), so
the internal-error rate shows next to the rewards.
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
    "RewardConfigError",
    "internal_error_counts",
    "internal_errors_key",
    "row_label",
    "total_over_responses",
]

MAX_RESPONSE_CHARS = 256 * 1024
"""Longest response (in code points) any verifier reads; longer ones score 0 unread. Far above
what a policy writes within verl's ``max_response_length`` (a token is rarely more than ~10 chars),
and small enough that every parser finishes in well under a second."""

_ERROR_TEXT_LIMIT = 300

_lock = threading.Lock()
_error_counts: Counter[str] = Counter()
_logged_sites: set[tuple[str, str, str, int]] = set()


class GroundTruthError(ValueError):
    """A row's ground truth cannot be read by its family's verifier (a data error, not a response's)."""


class RewardConfigError(ValueError):
    """A reward setting (a ``reward_kwargs`` entry) that the family refuses: raised, never scored as 0."""


def internal_errors_key(family: str) -> str:
    """The numeric reward key counting a family's internal errors: ``reward/<family>/internal_errors``."""
    return f"reward/{family}/internal_errors"


def internal_error_counts() -> dict[str, int]:
    """Internal errors per family in this process since start (or the last :func:`reset_internal_errors`)."""
    with _lock:
        return dict(_error_counts)


def reset_internal_errors() -> None:
    """Forget the counts and which sites were logged (for tests)."""
    with _lock:
        _error_counts.clear()
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


def _read_ground_truth_or_raise(family: str, arguments: Mapping[str, Any]) -> None:
    # Imported here: the readers import the families, whose verifiers import this module.
    from reward_fns.ground_truths import read_ground_truth

    try:
        read_ground_truth(family, **arguments)
    except RewardConfigError:
        raise  # a setting, not this row's data
    except Exception as error:
        raise _named_ground_truth_error(family, arguments, error) from error


def _reward_keys(family: str, arguments: Mapping[str, Any]) -> tuple[str, ...]:
    from reward_fns.ground_truths import reward_keys_for

    return reward_keys_for(family, arguments)


def _zero_result(family: str, keys: tuple[str, ...], info: str, internal_error: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"score": 0.0}
    for key in keys:
        result[key] = 0.0
        result[f"{key}_info"] = info
    result[internal_errors_key(family)] = 1.0 if internal_error else 0.0
    return result


def _record_internal_error(family: str, error: BaseException) -> None:
    """Count the error; log it with its traceback the first time its (family, type, line) is seen."""
    frames = traceback.extract_tb(error.__traceback__)
    last = frames[-1] if frames else None
    site = (family, type(error).__name__, last.filename if last else "?", (last.lineno or 0) if last else 0)
    with _lock:
        _error_counts[family] += 1
        first = site not in _logged_sites
        _logged_sites.add(site)
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
    return checked


def total_over_responses(family: str) -> Callable[[Callable[..., Any]], Callable[..., dict[str, Any]]]:
    """Decorate a family's ``compute_score`` to be total over responses (see the module docstring).

    Args:
        family: the family name (``text_to_sql``, ``tool_calling``, ``instruction_following``); its
            ground-truth reader and key set are looked up in :mod:`reward_fns.ground_truths`.

    Returns:
        The decorator. The wrapped function takes the same arguments and returns the family's keys
        plus ``reward/<family>/internal_errors``.
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
            _read_ground_truth_or_raise(family, arguments)
            keys = _reward_keys(family, arguments)
            response = arguments.get("solution_str")
            if isinstance(response, str) and len(response) > MAX_RESPONSE_CHARS:
                info = f"Response refused unread: {len(response):,} characters, over the {MAX_RESPONSE_CHARS:,} cap."
                return _zero_result(family, keys, info, internal_error=False)
            try:
                return _checked(family, compute_score(*args, **kwargs), keys)
            except RewardConfigError:
                raise
            except Exception as error:
                from reward_fns.ground_truths import GROUND_TRUTH_ERRORS

                if isinstance(error, GROUND_TRUTH_ERRORS):
                    raise _named_ground_truth_error(family, arguments, error) from error
                _record_internal_error(family, error)
                text = f"{type(error).__name__}: {error}"[:_ERROR_TEXT_LIMIT]
                return _zero_result(family, keys, f"Verifier internal error ({text}); the response scored 0.", True)

        return total_compute_score

    return decorate

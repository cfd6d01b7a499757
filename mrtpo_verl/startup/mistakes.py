"""A configuration mistake, told in one line: ``error: <field>: <value and problem>; <fix>``.

Hydra reports a bad override with a multi-line message (and, for an error inside the task, the
whole override list and a traceback); verl's checks raise ``AssertionError``/``ValueError`` from
deep inside. :func:`one_line` turns each of them into a single line that names the field, the value
and the fix; :mod:`mrtpo_verl.main_ppo` prints it last and exits with :data:`EXIT_CODE`.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence

__all__ = ["EXIT_CODE", "TRACEBACK_VARIABLES", "ConfigMistake", "one_line", "report", "wants_traceback"]

#: The exit status of a configuration mistake (argparse's and hydra's usage errors use 2 as well).
EXIT_CODE = 2
#: Either set to 1 prints the full traceback above the one-line error.
TRACEBACK_VARIABLES = ("MRTPO_TRACEBACK", "HYDRA_FULL_ERROR")
OVERRIDE_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


class ConfigMistake(Exception):
    """A mistake in the run's configuration or inputs, already phrased as one line."""


def wants_traceback(environ: dict[str, str] | None = None) -> bool:
    environ = dict(os.environ) if environ is None else environ
    return any(environ.get(name) == "1" for name in TRACEBACK_VARIABLES)


def report(error: BaseException, line: str, show_traceback: bool) -> None:
    """Print the traceback (when asked for) and then the one line, last, on stderr."""
    if show_traceback:
        traceback.print_exception(error)
    else:
        print(f"(set {TRACEBACK_VARIABLES[0]}=1 for the full traceback)", file=sys.stderr)
    print(f"error: {line}", file=sys.stderr, flush=True)


def flatten(text: str) -> str:
    """One line from a multi-line message; omegaconf's ``full_key``/``object_type`` trailer dropped."""
    lines = [line.strip() for line in str(text).splitlines()]
    kept = [line for line in lines if line and not line.startswith(("full_key:", "object_type=", "reference_type="))]
    return re.sub(r"\s+", " ", "; ".join(kept)).strip(" ;")


def closest(name: str, candidates: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else None


def one_line(
    error: BaseException,
    argv: Sequence[str] = (),
    keys_at: Callable[[str], list[str] | None] | None = None,
) -> str:
    """The mistake in one line: field, value, problem, fix.

    Args:
        error: what was raised while composing or checking the config.
        argv: the command-line overrides (to name the one hydra could not parse).
        keys_at: ``path → the keys the base config has there`` (None if the path is not a mapping),
            for "did you mean" suggestions; optional.
    """
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

    if isinstance(error, ConfigMistake):
        return flatten(str(error))
    if isinstance(error, OverrideParseException):
        bad = _unparsable_override(argv)
        where = f"override {bad!r}" if bad else "an override"
        return (
            f"{where} does not parse ({flatten(str(error)).split('; See ')[0]}); write key=value, quote values "
            f"with spaces, brackets or special characters (hydra's override grammar: {OVERRIDE_GRAMMAR})"
        )
    if isinstance(error, MissingConfigException):
        first = str(error).splitlines()[0] if str(error) else "a config is missing"
        return f"{first.rstrip('.')}; check --config-name / --config-path (ours: mrtpo_trainer, the default)"
    if isinstance(error, ConfigCompositionException):
        cause = error.__cause__
        if isinstance(cause, ConfigKeyError | ConfigAttributeError) and getattr(cause, "full_key", None):
            return _unknown_key(str(cause.full_key), str(error), keys_at)
        appended = re.search(r"An item is already at '([^']+)'", str(error))
        if appended:
            return (
                f"+{appended.group(1)}: the key already exists, so it cannot be added; drop the leading + "
                f"({appended.group(1)}=...) to set it"
            )
        return flatten(str(error) + (f"; {cause}" if cause else ""))
    if isinstance(error, OmegaConfBaseException):
        key = getattr(error, "full_key", None)
        return f"{key}: {flatten(str(error))}" if key else flatten(str(error))
    # str(KeyError) quotes its message; the message itself reads better.
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    message = flatten(text) or type(error).__name__
    if isinstance(error, ValueError | KeyError | TypeError) and _names_a_field(message):
        return message
    from mrtpo_verl.compat.verl import fields_of_verl_config_check

    fields = fields_of_verl_config_check(message)
    prefix = "verl's config check" if isinstance(error, AssertionError) else type(error).__name__
    return f"{prefix}: {message}" + (f" (set {fields[0]})" if fields else "")


def _names_a_field(message: str) -> bool:
    return bool(re.match(r"^\+?[\w.\[\]-]+: ", message))


def _unknown_key(full_key: str, message: str, keys_at: Callable[[str], list[str] | None] | None) -> str:
    """``mrtpo.bta: no such key (did you mean mrtpo.beta?)``, walking to the first segment that is unknown."""
    override = re.search(r"use \+(\S+)", message)
    # The mrtpo block takes no extra keys (MRTPOConfig rejects them), so "+" is no way out there.
    add = f", or add it with +{override.group(1)}" if override and not full_key.startswith("mrtpo.") else ""
    hint = ""
    if keys_at is not None:
        parent, _, leaf = full_key.rpartition(".")
        known = keys_at(parent)
        if known is not None:
            guess = closest(leaf, known)
            hint = f" (did you mean {parent + '.' if parent else ''}{guess}?)" if guess else ""
            if not guess:
                hint = f" (known keys there: {', '.join(sorted(known)[:12])}{', …' if len(known) > 12 else ''})"
    return f"{full_key}: no such key in the config{hint}; fix the spelling{add}"


def _unparsable_override(argv: Sequence[str]) -> str | None:
    """The first command-line override hydra's parser rejects."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for argument in argv:
        if argument.startswith("-"):
            continue
        try:
            parser.parse_overrides([argument])
        except Exception:  # any parse failure names the override
            return argument
    return None

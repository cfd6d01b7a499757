"""verl's checkpoint lock files in the temporary folder, and the clean-up the test session runs after them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from filelock import FileLock
from verl.utils.fs import local_mkdir_safe

from tests.support.temp_files import checkpoint_locks, remove_unheld_locks


def test_verl_leaves_a_checkpoint_lock_that_the_clean_up_removes_unless_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))  # what gettempdir() returns, inside verl too
    before = checkpoint_locks()
    assert before == set()

    local_mkdir_safe(str(tmp_path / "ckpt" / "global_step_1"))  # verl's own checkpoint mkdir
    left = checkpoint_locks() - before
    assert (tmp_path / "ckpt" / "global_step_1").is_dir()
    assert len(left) == 1, (
        "verl no longer leaves ckpt_*.lock in the temporary folder: update tests/support/temp_files.py"
    )

    held = folder / "ckpt_0000beef.lock"
    with FileLock(str(held)):  # a checkpoint save still running in another process
        removed = remove_unheld_locks(checkpoint_locks() - before)
        assert removed == sorted(left) and held.exists()
    assert checkpoint_locks() == {held}
    assert remove_unheld_locks([folder / "ckpt_gone.lock"]) == []

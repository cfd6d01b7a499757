"""The installed torch against the versions the seams' contract tests ran on: one warning line when outside."""

from __future__ import annotations

import logging

from mrtpo_verl.compat.torch_fsdp import TESTED_TORCH

__all__ = ["untested_torch", "warn_untested_torch"]

logger = logging.getLogger(__name__)


def _minor(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string such as ``2.13.0+cpu``; None when it does not start that way."""
    parts = version.split("+", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def untested_torch(version: str) -> str | None:
    """The warning for a torch ``version`` outside :data:`TESTED_TORCH`; None inside it."""
    first, last = TESTED_TORCH
    minor = _minor(version)
    if minor is not None and _minor(first) <= minor <= _minor(last):  # type: ignore[operator]
        return None
    return (
        f"mrtpo: torch {version} is outside {first}–{last}, the versions mrtpo_verl's seams to torch and verl were "
        f"tested on (mrtpo_verl.compat); install torch {first}–{last}, or run tests/test_compat_contract_on_cpu.py "
        "to see whether this one works"
    )


def warn_untested_torch(version: str | None = None) -> str | None:
    """Log :func:`untested_torch`'s line for the installed torch (or ``version``) at WARNING; returns it."""
    if version is None:
        import torch

        version = str(torch.__version__)
    line = untested_torch(version)
    if line is not None:
        logger.warning(line)
    return line

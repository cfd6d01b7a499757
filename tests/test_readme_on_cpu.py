"""The README stays a user's page: short, its links resolve, no run records."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_at_most_300_lines() -> None:
    assert len(README.splitlines()) <= 300, "README.md: move detail to docs/ (the README is the user's page)"


def test_every_relative_link_resolves() -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [target for target in targets if not re.match(r"[a-z]+://", target)]
    assert local
    missing = [target for target in local if not (ROOT / target).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_no_run_dates_or_load_averages() -> None:
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "a run date: put run records in benchmarks/*_latest.md"
    assert "load average" not in README.lower()


def test_the_test_command_is_make_test() -> None:
    assert "make test" in README and "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")

"""docs/configuration.md is generated from the config dataclasses and stays equal to them.

Regenerate with ``python -m mrtpo_verl.config_reference > docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mrtpo_verl import config, config_reference
from mrtpo_verl.config_reference import ConfigReferenceError

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
BAR = " \\| "  # a choice separator inside a markdown table cell


def _every_field_path() -> list[str]:
    top = [f"mrtpo.{f.name}" for f in dataclasses.fields(config.MRTPOConfig) if f.name != "replay"]
    return top + [f"mrtpo.replay.{f.name}" for f in dataclasses.fields(config.ReplayConfig)]


def _rows() -> dict[str, str]:
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    return {line.split("|")[1].strip().strip("`"): line for line in lines if line.startswith("| `mrtpo.")}


def test_the_page_is_what_the_dataclasses_give_now() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "mrtpo_verl.config_reference", "--check", str(PAGE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


def test_every_field_has_one_row_with_its_type_default_and_allowed_values() -> None:
    rows = _rows()
    assert list(rows) == _every_field_path()
    assert "| `float` | `0.5` | a number in [0, 1] |" in rows["mrtpo.beta"]
    assert "| " + BAR.join(config.ABLATIONS) + " |" in rows["mrtpo.ablation"]
    assert "| " + BAR.join(config.COMPUTE_DTYPES) + " |" in rows["mrtpo.replay.compute_dtype"]
    assert "${actor_rollout_ref.rollout.temperature} (otherwise 1.0)" in rows["mrtpo.replay.temperature"]


def test_allowed_values_are_the_validators_own() -> None:
    refs = {ref.path: ref for ref in config_reference.field_references()}
    for path, choices in [
        ("mrtpo.reweighting", config.REWEIGHTINGS),
        ("mrtpo.replay.placement", config.PLACEMENTS),
        ("mrtpo.replay.prefix_schedule", config.PREFIX_SCHEDULES),
        ("mrtpo.replay.dedicated_dtype", config.DEDICATED_DTYPES),
        ("mrtpo.on_incomplete_group", config.INCOMPLETE_GROUP_POLICIES),
    ]:
        assert refs[path].allowed == " | ".join(choices)
    assert refs["mrtpo.replay.js_chunk_size"].allowed == "an integer ≥ 1"
    block = {"reward_keys": ["r"], "verifier_info_keys": ["r_info"], "replay": {"js_chunk_size": 0}}
    with pytest.raises(config.MRTPOConfigError, match=r"\(allowed: an integer ≥ 1\)"):
        config.MRTPOConfig.from_block(block)


SHUFFLE_COMMENT = "  # Seed of the shuffle ablation's permutations (combined with the global step).\n"
EDITS: dict[str, tuple[Callable[[str], str], str]] = {
    "default_differs": (
        lambda text: text.replace("  beta: 0.5", "  beta: 0.7"),
        r"mrtpo\.beta: mrtpo_trainer\.yaml sets 0\.7 but the dataclass default is 0\.5",
    ),
    "no_comment": (lambda text: text.replace(SHUFFLE_COMMENT, ""), r"mrtpo\.shuffle_seed: no comment above it"),
    "field_missing": (
        lambda text: text.replace("    js_chunk_size: 256\n", ""),
        r"mrtpo\.replay\.js_chunk_size: a dataclass field missing",
    ),
    "unknown_field": (
        lambda text: text.replace("  beta: 0.5", "  beta: 0.5\n  gamma: 1"),
        r"mrtpo\.gamma: in mrtpo_trainer\.yaml but not a field",
    ),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_a_yaml_that_disagrees_with_the_dataclasses_is_named(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    edit, message = EDITS[case]
    text = config_reference._yaml_text()
    edited = edit(text)
    assert edited != text
    monkeypatch.setattr(config_reference, "_yaml_text", lambda: edited)
    with pytest.raises(ConfigReferenceError, match=message):
        config_reference.render()


def test_a_page_missing_a_field_is_out_of_date(tmp_path: Path) -> None:
    """A page written before a field existed fails the check (here: the page without its last row)."""
    lines = PAGE.read_text(encoding="utf-8").splitlines(keepends=True)
    last_row = max(i for i, line in enumerate(lines) if line.startswith("| `mrtpo."))
    stale = tmp_path / "configuration.md"
    stale.write_text("".join(lines[:last_row] + lines[last_row + 1 :]), encoding="utf-8")
    assert config_reference.main(["--check", str(stale)]) == 1
    assert config_reference.main(["--check", str(PAGE)]) == 0

"""setup.py moves no package of a verl[vllm]==0.9.1 GPU environment (checked without the registry).

``python scripts/install_check.py`` resolves ``verl[vllm]==0.9.1`` alone and together with this package with
pip's ``--dry-run --report`` (minutes, needs the registry) and records the result in
``requirements/verl_gpu_resolution.json``; ``docs/install_check_latest.md`` is its report. These tests hold the
current ``setup.py`` to that record: every requirement on a package verl's environment has admits verl's
version, every other requirement was part of the recorded resolution, and the recorded added packages admit
verl's versions of what they need.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from mrtpo_verl.compat.torch_fsdp import TESTED_TORCH

ROOT = Path(__file__).resolve().parents[1]
RESOLUTION = json.loads((ROOT / "requirements" / "verl_gpu_resolution.json").read_text(encoding="utf-8"))
VERL_VERSIONS = {canonicalize_name(name): version for name, version in RESOLUTION["verl_alone"].items()}
ADDED = {canonicalize_name(name): entry for name, entry in RESOLUTION["added"].items()}
RERUN = "run python scripts/install_check.py (needs the package registry) and commit its outputs"


def _setup_keyword(name: str) -> object:
    """A literal keyword argument of the setup() call in setup.py."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup":
            for keyword in node.keywords:
                if keyword.arg == name:
                    return ast.literal_eval(keyword.value)
    raise AssertionError(f"setup.py's setup() has no literal {name}=")


def install_requires() -> list[Requirement]:
    requirements = _setup_keyword("install_requires")
    assert isinstance(requirements, list)
    return [Requirement(text) for text in requirements]


def test_the_recorded_resolution_moved_nothing() -> None:
    assert RESOLUTION["moved"] == {} and RESOLUTION["dropped"] == []
    assert VERL_VERSIONS["torch"] == "2.11.0" and VERL_VERSIONS["vllm"] == "0.24.0"
    assert VERL_VERSIONS["transformers"] == "5.9.0"


def test_setup_requirements_admit_verls_versions() -> None:
    """A requirement on a package of verl's environment must admit the version verl[vllm]==0.9.1 picks."""
    for requirement in install_requires():
        name = canonicalize_name(requirement.name)
        if name in VERL_VERSIONS:
            assert requirement.specifier.contains(VERL_VERSIONS[name], prereleases=True), (
                f"setup.py: {requirement} would move {name} from {VERL_VERSIONS[name]}, the version verl[vllm]==0.9.1 "
                "installs; widen the range"
            )
        else:
            assert name in ADDED, f"setup.py: {name} is not in the recorded resolution; {RERUN}"


def test_the_added_packages_admit_verls_versions() -> None:
    """What the packages this one adds require of verl's packages (recorded metadata) admits verl's versions."""
    environment = {**default_environment(), **RESOLUTION["environment"]}
    for added, entry in ADDED.items():
        for text in entry["requires_dist"] or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({**environment, "extra": ""}):
                continue
            name = canonicalize_name(requirement.name)
            if name in VERL_VERSIONS:
                assert requirement.specifier.contains(VERL_VERSIONS[name], prereleases=True), (
                    f"{added} {entry['version']} requires {requirement}, against verl's {name} {VERL_VERSIONS[name]}"
                )


def test_torch_range_is_the_versions_the_seams_were_tested_on() -> None:
    """setup.py admits exactly the torch minor versions of TESTED_TORCH (the start-up warning names others)."""
    (torch,) = [r for r in install_requires() if r.name == "torch"]
    first, last = (tuple(int(part) for part in version.split(".")) for version in TESTED_TORCH)
    assert first[0] == last[0] == 2
    inside = [f"2.{minor}.0" for minor in range(first[1], last[1] + 1)] + [f"2.{last[1]}.9"]
    outside = [f"2.{first[1] - 1}.9", f"2.{last[1] + 1}.0"]
    assert all(torch.specifier.contains(version) for version in inside), (torch, inside)
    assert not any(torch.specifier.contains(version) for version in outside), (torch, outside)
    assert isinstance(torch.specifier, SpecifierSet)


def test_data_packages_are_not_part_of_verls_environment() -> None:
    """The data-only packages are installed with --no-deps, so they can only add, if verl's set lacks them."""
    lines = (ROOT / "requirements" / "data-packages.txt").read_text(encoding="utf-8").splitlines()
    names = [canonicalize_name(Requirement(line).name) for line in lines if line.strip() and not line.startswith("#")]
    assert names
    assert not [name for name in names if name in VERL_VERSIONS]

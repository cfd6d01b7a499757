"""The order ``make test``'s two workers take modules in: the longest listed first, the rest as collected."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import LONGEST_MODULES_FIRST, pytest_collection_modifyitems

REPO = Path(__file__).resolve().parents[1]


def test_every_module_listed_first_exists() -> None:
    """A renamed module would silently lose its place: every entry must name a test file."""
    assert len(set(LONGEST_MODULES_FIRST)) == len(LONGEST_MODULES_FIRST)
    for path in LONGEST_MODULES_FIRST:
        assert (REPO / path).is_file() and Path(path).name.endswith("_on_cpu.py"), path


def test_listed_modules_go_first_and_each_module_keeps_its_tests_in_order() -> None:
    first, second = LONGEST_MODULES_FIRST[0], LONGEST_MODULES_FIRST[1]
    collected = [
        "tests/math/test_a_on_cpu.py::test_one",
        f"{second}::test_x",
        "tests/math/test_a_on_cpu.py::test_two",
        f"{first}::test_y[1]",
        "tests/zeta_on_cpu.py::test_z",
        f"{first}::test_y[0]",
        f"{second}::test_w",
    ]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in collected]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        f"{first}::test_y[1]",
        f"{first}::test_y[0]",
        f"{second}::test_x",
        f"{second}::test_w",
        "tests/math/test_a_on_cpu.py::test_one",
        "tests/math/test_a_on_cpu.py::test_two",
        "tests/zeta_on_cpu.py::test_z",
    ]

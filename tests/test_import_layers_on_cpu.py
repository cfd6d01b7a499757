"""Layers seen from the imports: the trainer and the workers never import the demo; credit sits below all three.

The imports are read with ``ast`` (nothing is imported), including relative imports and imports inside
functions, so a lazy ``from mrtpo_verl.demo ... import`` in a method is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mrtpo_verl

PACKAGE_ROOT = Path(mrtpo_verl.__file__).parent

#: package folder → packages its modules must not import.
FORBIDDEN = {
    "trainer": ("mrtpo_verl.demo",),
    "workers": ("mrtpo_verl.demo",),
    "credit": ("mrtpo_verl.demo", "mrtpo_verl.trainer", "mrtpo_verl.workers"),
    "startup": ("mrtpo_verl.demo", "mrtpo_verl.trainer", "mrtpo_verl.workers", "mrtpo_verl.replay"),
}
#: What no module of the product (``mrtpo_verl``, ``reward_fns``) imports: the CPU backend, tests, benchmarks.
OUTSIDE_THE_PRODUCT = ("mrtpo_cpu", "tests", "benchmarks", "recipes")


def module_name(path: Path) -> str:
    """``mrtpo_verl/trainer/credit_dump.py`` → ``mrtpo_verl.trainer.credit_dump`` (a package → its name)."""
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Every module an ``import``/``from ... import`` in ``source`` names, relative ones made absolute.

    ``from a.b import c`` yields both ``a.b`` and ``a.b.c`` (``c`` may be a submodule).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def violations(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    module = module_name(path)
    imports = imported_modules(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
    return sorted(
        f"{module} imports {name}" for name in imports for f in forbidden if name == f or name.startswith(f + ".")
    )


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_folder_does_not_import_the_layers_above_it(folder: str) -> None:
    files = sorted((PACKAGE_ROOT / folder).rglob("*.py"))
    assert files, f"no modules found under {PACKAGE_ROOT / folder}"
    found = [v for path in files for v in violations(path, FORBIDDEN[folder])]
    assert not found, "imports across layers:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        "import mrtpo_verl.demo.batch",
        "from mrtpo_verl.demo import batch",
        "from mrtpo_verl.demo.tasks import TASKS",
        "from ..demo import batch",
        "from .. import demo",
        "def f():\n    from mrtpo_verl.demo.batch import pack_batch\n",
    ],
)
def test_the_check_sees_every_form_of_a_demo_import(source: str) -> None:
    # A module placed at mrtpo_verl/trainer/probe.py, as far as names go.
    imports = imported_modules(source, "mrtpo_verl.trainer.probe", is_package=False)
    assert any(name == "mrtpo_verl.demo" or name.startswith("mrtpo_verl.demo.") for name in imports), imports


def test_the_check_does_not_flag_lookalikes() -> None:
    imports = imported_modules(
        "import mrtpo_verl.demographics\nfrom .demo_helpers import x\n", "mrtpo_verl.trainer.probe", False
    )
    assert not [n for n in imports if n == "mrtpo_verl.demo" or n.startswith("mrtpo_verl.demo.")], imports


@pytest.mark.parametrize("package", ["mrtpo_verl", "reward_fns"])
def test_the_product_imports_nothing_from_outside_it(package: str) -> None:
    """The CPU backend (``mrtpo_cpu``), the tests and the benchmarks sit beside the product, never under it."""
    files = sorted((PACKAGE_ROOT.parent / package).rglob("*.py"))
    assert files, f"no modules found under {package}"
    found = [v for path in files for v in violations(path, OUTSIDE_THE_PRODUCT)]
    assert not found, "the product imports from outside it:\n" + "\n".join(found)

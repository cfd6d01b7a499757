"""Does installing mrtpo-verl into a verl[vllm]==0.9.1 environment move any package? (needs the package registry)

Resolves, with pip's ``--dry-run --report`` (nothing is installed), once ``verl[vllm]==0.9.1`` alone and once
``verl[vllm]==0.9.1`` together with this repository, both from scratch (``--ignore-installed``) for this
interpreter's Python and platform, and compares the versions picked: every package of the first must be picked
at the same version in the second (the plugin adds packages, it never moves one). pip runs ``--isolated``, so
no pip configuration file or ``PIP_*`` variable of this machine (a constraints file capping torch, local wheel
folders) shapes the answer; a GPU node's resolution is what PyPI gives.

Writes ``requirements/verl_gpu_resolution.json`` (verl's versions, the packages added with their requirements,
the environment), which ``tests/test_install_check_on_cpu.py`` checks ``setup.py`` against without the registry,
and ``docs/install_check_latest.md``. Exit status 1 when a package moved.

    python scripts/install_check.py            # about 10 minutes, mostly pip fetching metadata
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VERL = "verl[vllm]==0.9.1"
RESOLUTION = ROOT / "requirements" / "verl_gpu_resolution.json"
REPORT = ROOT / "docs" / "install_check_latest.md"
SHOWN = ("torch", "transformers", "vllm", "verl", "ray", "numpy", "triton", "tensordict", "omegaconf", "hydra-core")


def _name(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pip_command(report: Path, *requirements: str) -> list[str]:
    """The pip dry run: isolated from this machine's pip settings, resolving from scratch."""
    command = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "--quiet"]
    if os.environ.get("PIP_CERT"):  # --isolated drops PIP_CERT; keep the machine's CA bundle for the registry
        command += ["--cert", os.environ["PIP_CERT"]]
    return [*command, "--report", str(report), *requirements]


def resolve(report: Path, *requirements: str) -> tuple[dict[str, Any], float]:
    """pip's report and the seconds it took."""
    started = time.monotonic()
    subprocess.run(pip_command(report, *requirements), check=True)
    return json.loads(report.read_text(encoding="utf-8")), time.monotonic() - started


def picked(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}


def compare(alone: dict[str, Any], together: dict[str, Any]) -> dict[str, Any]:
    """Versions of verl alone, packages moved or dropped by adding this one, packages added."""
    first, second = picked(alone), picked(together)
    return {
        "verl_alone": {name: meta["version"] for name, meta in sorted(first.items())},
        "moved": {
            name: [first[name]["version"], second[name]["version"]]
            for name in first
            if name in second and first[name]["version"] != second[name]["version"]
        },
        "dropped": sorted(name for name in first if name not in second),
        "added": {
            name: {"version": meta["version"], "requires_dist": meta.get("requires_dist", [])}
            for name, meta in sorted(second.items())
            if name not in first
        },
        "environment": alone["environment"],
    }


def markdown(result: dict[str, Any], seconds: tuple[float, float], pip_version: str) -> str:
    env = result["environment"]
    alone = result["verl_alone"]
    ok = not result["moved"] and not result["dropped"]
    lines = [
        "# Install check: mrtpo-verl into a verl[vllm]==0.9.1 environment",
        "",
        "Written by `python scripts/install_check.py` (needs the package registry; nothing is installed).",
        "",
        "```bash",
        " ".join(pip_command(Path("alone.json"), VERL)).replace(sys.executable, "python"),
        " ".join(pip_command(Path("together.json"), VERL, ".")).replace(sys.executable, "python"),
        "```",
        "",
        f"pip {pip_version}, Python {env['python_full_version']}, {env['sys_platform']} {env['platform_machine']}; "
        "`--isolated`: no pip configuration file or `PIP_*` variable applies (this machine's constraints file caps "
        "torch at 2.14.1; a GPU node's resolution must not be shaped by it).",
        f"Seconds: {seconds[0]:.0f} (verl alone), {seconds[1]:.0f} (verl with mrtpo-verl).",
        "",
        f"**Result: {'no package moved' if ok else 'PACKAGES MOVED'}** — {len(alone)} packages picked for verl "
        f"alone, the same {len(alone) - len(result['dropped'])} at the same versions with mrtpo-verl, "
        f"{len(result['added'])} added.",
        "",
        "| package | verl[vllm]==0.9.1 alone | with mrtpo-verl |",
        "|---|---|---|",
    ]
    for name in SHOWN:
        if name in alone:
            lines.append(f"| {name} | {alone[name]} | {result['moved'].get(name, [None, alone[name]])[1]} |")
    lines += [
        "",
        "Moved: " + (", ".join(f"{n} {a} → {b}" for n, (a, b) in result["moved"].items()) or "none") + ".",
        "Dropped: " + (", ".join(result["dropped"]) or "none") + ".",
        "Added: " + ", ".join(f"{n} {m['version']}" for n, m in result["added"].items()) + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--reports",
        nargs=2,
        metavar=("ALONE", "TOGETHER"),
        help="use two pip reports already made by the commands above",
    )
    args = parser.parse_args(argv)
    if args.reports:
        alone, together = (json.loads(Path(p).read_text(encoding="utf-8")) for p in args.reports)
        seconds = (float("nan"), float("nan"))
    else:
        with tempfile.TemporaryDirectory() as folder:
            alone, first = resolve(Path(folder) / "alone.json", VERL)
            together, second = resolve(Path(folder) / "together.json", VERL, str(ROOT))
        seconds = (first, second)
    result = compare(alone, together)
    result["command"] = " ".join(pip_command(Path("report.json"), VERL, ".")).replace(sys.executable, "python")
    RESOLUTION.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    REPORT.write_text(markdown(result, seconds, together.get("pip_version", "?")), encoding="utf-8")
    print(REPORT.read_text(encoding="utf-8"))
    return 0 if not result["moved"] and not result["dropped"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

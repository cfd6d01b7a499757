"""The Triton JS kernel run by Triton's CPU interpreter (TRITON_INTERPRET=1) against the torch path.

Triton is not a dependency of the package: ``make venv`` installs it into ``.venv/triton-interpreter``,
outside site-packages, and only these tests' subprocesses see it (on PYTHONPATH). Without it they
skip, unless ``MRTPO_REQUIRE_TRITON_INTERPRETER=1`` (set by ``make test``) makes its absence a failure.

The interpreter executes the kernel's own code, block loop and masking included, with numpy float32
maths, so this checks the algorithm and its edge cases; the GPU's approximate exp/div and its speed
are checked by ``python -m benchmarks.gpu_check`` on a GPU machine.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: Where ``make venv`` installs Triton for the interpreter (requirements/triton-interpreter.txt).
INTERPRETER_TRITON = Path(sys.prefix) / "triton-interpreter"


def _interpreter_env() -> dict[str, str]:
    """This process's environment with TRITON_INTERPRET=1 and, when present, the interpreter's Triton on PYTHONPATH."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    if (INTERPRETER_TRITON / "triton").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(INTERPRETER_TRITON), env.get("PYTHONPATH")) if p)
    return env


def _triton_version(env: dict[str, str]) -> str | None:
    probe = subprocess.run(
        [sys.executable, "-c", "import triton; print(triton.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


@pytest.fixture(scope="module")
def interpreter_env() -> dict[str, str]:
    env = _interpreter_env()
    if _triton_version(env) is None:
        reason = f"Triton is not installed here nor in {INTERPRETER_TRITON} (make venv installs it there)"
        if os.environ.get("MRTPO_REQUIRE_TRITON_INTERPRETER") == "1":
            pytest.fail(reason + "; MRTPO_REQUIRE_TRITON_INTERPRETER=1 requires it")
        pytest.skip(reason)
    return env


SCRIPT = textwrap.dedent(
    """
    import torch
    from mrtpo_verl.math.relevance import js_distance

    def pair(n, vocab, scale, eps, seed, dtype=torch.float32):
        g = torch.Generator().manual_seed(seed)
        p = torch.randn(n, vocab, generator=g) * scale
        return p.to(dtype), (p + eps * torch.randn(n, vocab, generator=g)).to(dtype)

    cases = {
        "random": pair(5, 5000, 3.0, 3.0, 0),
        "close": pair(5, 5000, 3.0, 1e-4, 1),
        "bf16": pair(4, 4500, 3.0, 0.3, 2, torch.bfloat16),
        "tiny vocab": pair(3, 3, 1.0, 1.0, 3),
        "one block exactly": pair(2, 4096, 2.0, 0.5, 4),
        "near-identical": pair(4, 5000, 3.0, 1e-5, 8),
    }
    p, q = pair(4, 5000, 3.0, 1e-3, 9)
    p[:, 0] += 25.0
    q[:, 0] += 24.0
    cases["peaked"] = (p, q)
    g = torch.Generator().manual_seed(10)
    cases["+-1e4 logits"] = (
        torch.randn(6, 300, generator=g).sign() * 1e4,
        torch.randn(6, 300, generator=g).sign() * 1e4,
    )
    p, q = pair(6, 3000, 3.0, 0.05, 5)
    p[:, 100:900] = float("-inf")
    q[:, 500:1500] = float("-inf")
    p[0, 2000] = 1e4
    q[1, 2500] = -1e4
    cases["masked and extreme"] = (p, q)
    wide_p, wide_q = pair(4, 6000, 3.0, 0.2, 6)
    cases["strided rows"] = (wide_p[:, :5000], wide_q[:, 1000:])
    cases["non-contiguous"] = (wide_p.t().contiguous().t()[:, :700], wide_q[:, :700])

    worst = 0.0
    for name, (p, q) in cases.items():
        got = js_distance(p, q, backend="triton")
        ref = js_distance(p, q, backend="torch")
        err = (got - ref).abs().max().item()
        worst = max(worst, err)
        print(f"{name}: max abs error {err:.2e}")
        assert err < 1e-6, name

    p, _ = pair(7, 5000, 4.0, 0.0, 7)
    assert torch.equal(js_distance(p, p.clone(), backend="triton"), torch.zeros(7)), "identical rows"

    from mrtpo_verl.math.relevance_triton import js_divergence_bits
    bad = torch.zeros(4, 300)
    bad[0, 7] = float("nan")
    bad[1, 8] = float("inf")
    bad[2] = float("-inf")
    div = js_divergence_bits(bad, torch.zeros(4, 300))
    assert torch.isnan(div[:3]).all() and div[3].item() == 0.0, div
    div = js_divergence_bits(torch.zeros(4, 300), bad)
    assert torch.isnan(div[:3]).all() and div[3].item() == 0.0, div
    from mrtpo_verl.math.relevance import js_distance_one_to_many
    g = torch.Generator().manual_seed(11)
    full = torch.randn(5, 2000, generator=g) * 3.0
    loo = full[None] + 0.2 * torch.randn(3, 5, 2000, generator=g)
    loo[1] = full  # a leave-one-out context that changes nothing: distance exactly 0
    got = js_distance_one_to_many(full, loo, backend="triton")
    ref = js_distance_one_to_many(full, loo, backend="torch")
    err = (got - ref).abs().max().item()
    worst = max(worst, err)
    print(f"one to many: max abs error {err:.2e}")
    assert got.shape == (3, 5) and err < 1e-6 and torch.equal(got[1], torch.zeros(5)), (got, ref)
    print("OK worst", worst)
    """
)


def test_kernel_matches_the_torch_path_in_the_interpreter(interpreter_env: dict[str, str]) -> None:
    env = interpreter_env
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK worst" in result.stdout

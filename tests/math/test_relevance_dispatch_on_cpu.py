"""Backend dispatch of js_distance: the Triton kernel for CUDA tensors when it imports, the torch path otherwise.

No GPU here, so the kernel module is replaced by a fake that records its calls; the real kernel's numerics
are checked by test_relevance_triton_interpreter_on_cpu.py (Triton's CPU interpreter, where Triton is
installed) and on a GPU by benchmarks/gpu_check.py.
"""

import importlib
import logging
import sys
import types
from collections.abc import Iterator

import pytest
import torch

from mrtpo_verl.math import relevance, relevance_triton
from mrtpo_verl.math.relevance import js_distance, js_distance_one_to_many


@pytest.fixture
def fresh_loader() -> Iterator[None]:
    """Forget the cached import result before and after the test."""
    relevance_triton._load.cache_clear()
    yield
    relevance_triton._load.cache_clear()


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch, fresh_loader: None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Install a fake kernel module that returns 0.25 bits per row (NaN for rows whose first logit is NaN)."""
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []

    def js_divergence_bits(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
        calls.append((logits_p, logits_q))
        out = torch.full((logits_p.shape[0],), 0.25)
        out[torch.isnan(logits_p[:, 0])] = float("nan")
        return out

    module = types.ModuleType(relevance_triton.KERNEL_MODULE)
    module.js_divergence_bits = js_divergence_bits  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, relevance_triton.KERNEL_MODULE, module)
    return calls


def test_math_package_imports_without_triton() -> None:
    assert importlib.util.find_spec("mrtpo_verl.math.relevance_triton") is not None
    assert "triton" not in relevance_triton.__dict__


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None, reason="Triton is installed here")
def test_this_machine_without_triton(fresh_loader: None) -> None:
    assert not relevance_triton.triton_available()
    with pytest.raises(RuntimeError, match="No module named 'triton'"):
        relevance_triton.require_triton()


def test_without_triton_auto_uses_torch_and_forcing_triton_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, fresh_loader: None
) -> None:
    monkeypatch.setitem(sys.modules, relevance_triton.KERNEL_MODULE, None)  # import raises ImportError
    assert not relevance_triton.triton_available()
    logits = torch.randn(4, 10)
    assert js_distance(logits, logits + 1, backend="auto").shape == (4,)
    with pytest.raises(RuntimeError, match=r"backend='triton'\) needs Triton"):
        js_distance(logits, logits, backend="triton")


def test_forced_triton_calls_the_kernel_and_postprocesses_its_divergence(
    fake_kernel: list[tuple[torch.Tensor, torch.Tensor]],
) -> None:
    logits_p, logits_q = torch.randn(3, 10), torch.randn(3, 10)
    distance = js_distance(logits_p, logits_q, chunk=1, backend="triton")
    assert torch.equal(distance, torch.full((3,), 0.5))  # sqrt(0.25)
    assert len(fake_kernel) == 1 and fake_kernel[0][0] is logits_p and fake_kernel[0][1] is logits_q
    logits_p[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"token rows \[1\]"):
        js_distance(logits_p, logits_q, backend="triton")


def test_one_to_many_forced_triton_calls_the_kernel_once_per_context(
    fake_kernel: list[tuple[torch.Tensor, torch.Tensor]],
) -> None:
    distance = js_distance_one_to_many(torch.randn(5, 10), torch.randn(4, 5, 10), backend="triton")
    assert torch.equal(distance, torch.full((4, 5), 0.5)) and len(fake_kernel) == 4


def test_auto_uses_the_kernel_only_for_cuda_tensors(fake_kernel: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    assert relevance_triton.triton_available()
    logits = torch.randn(3, 10)
    assert torch.equal(js_distance(logits, logits.clone()), torch.zeros(3))  # CPU tensors: torch path
    assert fake_kernel == []


@pytest.mark.parametrize(
    ("is_cuda", "available", "backend", "expected"),
    [
        (True, True, "auto", True),
        (True, False, "auto", False),
        (False, True, "auto", False),
        (True, True, "torch", False),
        (False, True, "triton", True),
    ],
)
def test_dispatch_table(
    monkeypatch: pytest.MonkeyPatch, is_cuda: bool, available: bool, backend: relevance.JSBackend, expected: bool
) -> None:
    monkeypatch.setattr(relevance_triton, "triton_available", lambda: available)
    monkeypatch.setattr(relevance_triton, "require_triton", lambda: None)
    fake_tensor = types.SimpleNamespace(is_cuda=is_cuda)
    assert relevance._use_triton(fake_tensor, backend) is expected  # type: ignore[arg-type]


def test_unknown_backend_is_an_error() -> None:
    with pytest.raises(ValueError, match="backend must be"):
        js_distance(torch.zeros(2, 3), torch.zeros(2, 3), backend="cuda")  # type: ignore[arg-type]


def test_a_broken_triton_install_warns_once_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, fresh_loader: None, caplog: pytest.LogCaptureFixture
) -> None:
    real_import = importlib.import_module

    def broken_import(name: str, package: str | None = None) -> types.ModuleType:
        if name == relevance_triton.KERNEL_MODULE:
            raise RuntimeError("libcuda.so: version mismatch")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", broken_import)
    with caplog.at_level(logging.WARNING, logger=relevance_triton.__name__):
        assert not relevance_triton.triton_available()
        assert not relevance_triton.triton_available()
    assert [r.getMessage() for r in caplog.records if "version mismatch" in r.getMessage()] != []
    assert len(caplog.records) == 1
    with pytest.raises(RuntimeError, match="version mismatch"):
        relevance_triton.require_triton()

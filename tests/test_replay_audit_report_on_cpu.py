"""The driver's side of the replay audit: the ranks' entries (as verl's collect hands them, a list per entry) turned
into ``mrtpo/replay/…`` metrics and at most one warning. The ranks' side runs on the real model in
tests/trainer/test_replay_audit_on_cpu.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from verl.protocol import DataProto

import mrtpo_verl.replay.audit as audit
from mrtpo_verl.batch_keys import RANK_TIME_METRIC
from mrtpo_verl.replay.audit import (
    AUDIT_ENTRY,
    COMPUTE_DTYPE_ENTRY,
    FALLBACK_ENTRY,
    WEIGHTS_DTYPE_ENTRY,
    audit_sums,
    replay_report,
)


@pytest.fixture(autouse=True)
def _nothing_named_yet(monkeypatch):
    monkeypatch.setattr(audit, "_NAMED", set())


def collected(*ranks: dict) -> dict:
    """The ranks' ``meta_info["metrics"]`` as verl's ``DataProto.concat`` (the worker groups' collect) merges them."""
    answers = [DataProto.from_dict(tensors={"x": torch.zeros(1)}, meta_info={"metrics": rank}) for rank in ranks]
    return DataProto.concat(answers).meta_info["metrics"]


def rank(configured: torch.Tensor, reference: torch.Tensor, dtype: str = "fp16", fallback: str = "") -> dict:
    return {
        RANK_TIME_METRIC: 1.0,
        COMPUTE_DTYPE_ENTRY: dtype,
        FALLBACK_ENTRY: fallback,
        AUDIT_ENTRY: audit_sums(configured, reference, rows=1, seconds=0.5),
    }


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == audit.__name__ and r.levelno == logging.WARNING]


def test_pooled_over_ranks_as_one_sample(caplog) -> None:
    generator = torch.Generator().manual_seed(0)
    reference = [torch.rand(40, generator=generator), torch.rand(25, generator=generator)]
    noise = [0.004 * torch.randn(40, generator=generator), 0.02 * torch.randn(25, generator=generator)]
    configured = [(r + n).clamp(min=0) for r, n in zip(reference, noise, strict=True)]
    metrics = replay_report(collected(*map(rank, configured, reference)), global_step=101, requested="auto")
    x, y = torch.cat(configured).double().numpy(), torch.cat(reference).double().numpy()
    assert metrics["mrtpo/replay/audit_max_dq"] == pytest.approx(float(np.abs(x - y).max()), abs=1e-7)
    assert metrics["mrtpo/replay/audit_pearson"] == pytest.approx(float(np.corrcoef(x, y)[0, 1]), abs=1e-9)
    assert (metrics["mrtpo/replay/audit_rows"], metrics["mrtpo/replay/audit_tokens"]) == (2, 65)
    assert metrics["mrtpo/replay/compute_dtype/fp16"] == 2 and metrics["mrtpo/replay/dtype_fallbacks"] == 0
    (message,) = warnings_of(caplog)  # max |dq| above 0.01 (the second rank's noise): one line for the audit
    assert "global step 101" in message and "compute_dtype=auto (computed in fp16)" in message
    assert "Set mrtpo.replay.compute_dtype=fp32 or tf32" in message


def test_within_the_bound_no_warning(caplog) -> None:
    reference = torch.linspace(0, 0.5, 30)
    metrics = replay_report(collected(rank(reference + 0.009, reference)), global_step=1, requested="fp16")
    assert metrics["mrtpo/replay/audit_max_dq"] == pytest.approx(0.009, abs=1e-7)
    assert metrics["mrtpo/replay/audit_pearson"] == pytest.approx(1.0, abs=1e-9)
    assert warnings_of(caplog) == []


def test_no_audit_entry_no_audit_metrics() -> None:
    entries = {RANK_TIME_METRIC: 1.0, COMPUTE_DTYPE_ENTRY: "fp32", FALLBACK_ENTRY: "", WEIGHTS_DTYPE_ENTRY: "fp32"}
    metrics = replay_report(collected(entries, entries), global_step=2, requested="fp32")
    assert metrics == {
        "mrtpo/replay/compute_dtype/fp32": 2.0,
        "mrtpo/replay/weights_dtype/fp32": 2.0,
        "mrtpo/replay/dtype_fallbacks": 0.0,
    }
    assert replay_report({}, global_step=2, requested="fp32") == {}  # an in-process backend reports nothing


def test_a_fallback_is_counted_every_step_and_named_once(caplog) -> None:
    reason = "auto -> tf32 instead of fp16 on cuda:0: no fp16 matmul with float32 output"
    q = torch.rand(10)
    ranks = collected(rank(q, q, "tf32", reason), rank(q, q, "fp16"))
    first = replay_report(ranks, global_step=1, requested="auto")
    second = replay_report(ranks, global_step=2, requested="auto")
    for metrics in (first, second):
        assert metrics["mrtpo/replay/dtype_fallbacks"] == 1
        assert metrics["mrtpo/replay/compute_dtype/tf32"] == metrics["mrtpo/replay/compute_dtype/fp16"] == 1
    (message,) = warnings_of(caplog)
    assert reason in message and "1 rank(s) at global step 1" in message and "dtype_fallbacks" in message

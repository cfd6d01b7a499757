"""The replay audits its own precision where it runs, and reports the dtypes it decided on.

On the real SmolLM2-135M-Instruct weights and a real batch (SmolLM2 answers to Spider questions):

- a dedicated replay worker group on Ray computing in bf16 (``compute_dtype: model`` on bf16 weights, a genuinely
  noisy mode) fires the audit: ``mrtpo/replay/audit_max_dq`` above 0.01 and one warning naming the dtype and the
  fix; float32 compute audits to ~0 with no warning;
- the colocated replay on verl's two-rank FSDP2 actor audits on both ranks (its passes are collectives);
- ``compute_dtype: auto`` falling back is decided on the worker, with the weights' dtype that follows from it,
  counted in ``mrtpo/replay/dtype_fallbacks`` and named once.

The only stand-ins: Ray's placement groups for the colocated group ask for logical GPUs (every tensor is on the
CPU), and the fallback test makes ``auto`` choose fp16 on this CPU as it does on CUDA (this CPU's torch has no fp16
matmul with float32 output, which is the fallback's cause on a GPU too; the real probe answers).
"""

from __future__ import annotations

import logging

import pytest
import torch

import mrtpo_verl.replay.audit as audit_module
from mrtpo_verl.batch_keys import NEEDED_KEY
from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError, ReplayConfig
from mrtpo_verl.replay.audit import audit_due, audit_rows
from mrtpo_verl.trainer.replay_stage import ReplayStage, build_request
from mrtpo_verl.workers.collect import concat_releasing
from mrtpo_verl.workers.placement import ColocatedBackend, DedicatedBackend, _plain_block, create_replay_worker_group
from mrtpo_verl.workers.replay_worker import ReplayWorker, weights_to_send
from tests.support.actor_groups import RANKS, cpu_ray_cluster, started_actor_group
from tests.support.ray_groups import release
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch, smollm2

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

AUDIT = "mrtpo/replay/audit_max_dq"


def config(**replay: object) -> MRTPOConfig:
    return MRTPOConfig(
        reward_keys=REWARD_KEYS,
        verifier_info_keys=INFO_KEYS,
        replay=ReplayConfig(**({"micro_batch_size": 4, "audit_every": 1} | replay)),  # type: ignore[arg-type]
    )


@pytest.fixture(autouse=True)
def _nothing_named_yet(monkeypatch):
    monkeypatch.setattr(audit_module, "_NAMED", set())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The real SmolLM2-135M-Instruct saved as a plain HF folder (every worker loads it from there)."""
    model, tokenizer = smollm2()
    out = tmp_path_factory.mktemp("smollm2")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def audit_warnings(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == audit_module.__name__ and "replay audit" in r.getMessage()
    ]


def test_audit_every_is_validated_in_one_line() -> None:
    for bad in (-1, 1.5, "50", True, None):
        with pytest.raises(MRTPOConfigError, match=r"^mrtpo\.replay\.audit_every: got .* \(allowed: an integer ≥ 0"):
            ReplayConfig(audit_every=bad).validate()  # type: ignore[arg-type]
    ReplayConfig(audit_every=0).validate()


def test_the_schedule_and_the_sampled_rows() -> None:
    assert [step for step in range(1, 302) if audit_due(step, 100)] == [1, 101, 201, 301]
    assert not any(audit_due(step, 0) for step in range(1, 50)) and not audit_due(None, 1)
    request = build_request(real_sql_batch(), config(), torch.ones(4, len(REWARD_KEYS), dtype=torch.bool))
    drawn = {tuple(audit_rows(request, step)) for step in range(1, 40)}
    assert all(audit_rows(request, 7) == audit_rows(request, 7) for _ in range(3))  # seeded by the step
    assert len(drawn) == 4 and all(len(rows) == 1 for rows in drawn)  # every row gets audited over the steps
    request.batch[NEEDED_KEY][1:] = False
    assert {tuple(audit_rows(request, step)) for step in range(1, 10)} == {(0,)}  # only rows with work


@pytest.fixture(scope="module")
def ray_cluster():
    """One local cluster for the module: CPUs for the dedicated workers, logical GPUs for the actor group."""
    with cpu_ray_cluster(RANKS):
        yield


def audited_step(model_dir: str, cfg: MRTPOConfig, dtype: str, caplog, steps=(1,)) -> list[dict[str, float]]:
    """The replay stage's metrics at ``steps`` on a dedicated worker group of one worker holding ``dtype`` weights
    (``auto``: the worker decides, and says what through Ray)."""
    group = create_replay_worker_group(cfg, model_dir, [1], "cpu", cpus_per_worker=1, dtype=dtype)
    try:
        (report,) = group.replay_dtypes()
        if dtype != "auto":
            assert report["weights"] == dtype, report
        stage = ReplayStage(cfg, None, DedicatedBackend(group))
        with caplog.at_level(logging.WARNING, logger=audit_module.__name__):
            return [stage.run(real_sql_batch(), global_step=step)[1] for step in steps]
    finally:
        release(group)


def test_bf16_compute_on_a_dedicated_worker_fires_the_audit(ray_cluster, model_dir, caplog) -> None:
    (metrics,) = audited_step(model_dir, config(compute_dtype="model"), "bf16", caplog)
    print({key: value for key, value in metrics.items() if "audit" in key})
    assert metrics["mrtpo/replay/compute_dtype/model"] == 1 and metrics["mrtpo/replay/weights_dtype/bf16"] == 1
    assert metrics["mrtpo/replay/audit_rows"] == 1 and metrics["mrtpo/replay/audit_tokens"] >= 16
    assert metrics[AUDIT] > 0.01, metrics[AUDIT]  # bf16 rounding against float32 compute on the same weights
    assert 0.5 < metrics["mrtpo/replay/audit_pearson"] < 0.99999
    (message,) = audit_warnings(caplog)  # one line
    assert "mrtpo replay audit at global step 1" in message and "compute_dtype=model (computed in model)" in message
    assert "Set mrtpo.replay.compute_dtype=fp32 or tf32" in message


def test_float32_compute_audits_to_zero_without_a_warning(ray_cluster, model_dir, caplog) -> None:
    (metrics,) = audited_step(model_dir, config(compute_dtype="fp32"), "bf16", caplog)
    print({key: value for key, value in metrics.items() if "audit" in key})
    assert metrics["mrtpo/replay/compute_dtype/fp32"] == 1 and metrics["mrtpo/replay/dtype_fallbacks"] == 0
    assert metrics[AUDIT] < 1e-4 and metrics["mrtpo/replay/audit_pearson"] > 0.9999
    assert audit_warnings(caplog) == []
    off = config(compute_dtype="fp32", audit_every=0)
    (quiet,) = audited_step(model_dir, off, "auto", caplog)  # auto with compute fp32: float32 weights
    assert AUDIT not in quiet and audit_warnings(caplog) == []  # 0 turns it off
    assert quiet["mrtpo/replay/weights_dtype/fp32"] == 1 and quiet["mrtpo/replay/compute_dtype/fp32"] == 1


def test_colocated_replay_audits_on_every_rank(ray_cluster, tmp_path, caplog) -> None:
    """Each rank of verl's two-rank FSDP2 actor audits a row of its shard (the audit's passes are collectives: a
    rank that skipped them would hang the other). A two-layer copy of SmolLM2 keeps the engine quick; its bf16
    compute is less noisy than the whole model's, so the bound here is bf16's, not the warning's."""
    from mrtpo_cpu.launch import save_derived_model

    path = save_derived_model(tmp_path / "model", num_layers=2)
    fsdp = "actor_rollout_ref.actor.fsdp_config"
    options = (f"{fsdp}.model_dtype=bf16", f"+{fsdp}.mixed_precision.param_dtype=bf16")
    in_bf16, in_fp32 = config(compute_dtype="model"), config(compute_dtype="fp32")
    warnings = caplog.at_level(logging.WARNING, logger=audit_module.__name__)
    with started_actor_group(path, options, name="audit_test") as group, warnings:
        _, bf16 = ReplayStage(in_bf16, None, ColocatedBackend(group, in_bf16)).run(real_sql_batch(), 1)
        _, fp32 = ReplayStage(in_fp32, None, ColocatedBackend(group, in_fp32)).run(real_sql_batch(), 1)
    assert bf16["mrtpo/replay/audit_rows"] == RANKS and fp32["mrtpo/replay/audit_rows"] == RANKS
    assert bf16["mrtpo/replay/compute_dtype/model"] == RANKS and fp32["mrtpo/replay/compute_dtype/fp32"] == RANKS
    print({"bf16": bf16[AUDIT], "fp32": fp32[AUDIT]})
    assert bf16[AUDIT] > 1e-3 and fp32[AUDIT] < 1e-4, (bf16[AUDIT], fp32[AUDIT])
    assert all("compute_dtype=model" in message for message in audit_warnings(caplog))  # never the fp32 run


def test_auto_falling_back_is_decided_on_the_worker_and_counted(model_dir, monkeypatch, caplog) -> None:
    """The worker's compute_dtype auto probes its own device: where the fp16 kernel is missing it computes in
    tf32, so its weights are float32 (not fp16-rounded), and every step counts the fallback."""
    import mrtpo_verl.replay.scorer as scorer_module

    def auto_as_on_cuda(compute_dtype: str, device_type: str) -> str:
        return "fp16" if compute_dtype == "auto" else compute_dtype

    monkeypatch.setattr(scorer_module, "resolve_compute_dtype", auto_as_on_cuda)
    monkeypatch.setattr(audit_module, "resolve_compute_dtype", auto_as_on_cuda)
    monkeypatch.setattr(scorer_module, "_LOGGED_RESOLUTIONS", set())
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}.items():
        monkeypatch.setenv(name, value)
    cfg = config(compute_dtype="auto", dedicated_dtype="auto")
    worker = ReplayWorker(_plain_block(cfg), model_dir, "cpu", 1, dtype=cfg.replay.dedicated_dtype, actor_dtype="bf16")
    worker.init_model()
    report = worker.replay_dtypes()
    assert (report["weights"], report["compute"]) == ("fp32", "tf32"), report
    assert report["fallback"].startswith("auto -> tf32 instead of fp16 on cpu: ")
    assert next(p.dtype for p in worker.model.parameters()) == torch.float32
    assert weights_to_send([report]) == "fp32"

    class OneWorker:  # the worker's own method; its answer put together by verl's collect, as one rank's
        name = "in_process_worker"

        def compute_relevance(self, request):
            return concat_releasing([worker.compute_relevance(request)])

    stage = ReplayStage(cfg, None, OneWorker())
    with caplog.at_level(logging.WARNING, logger=audit_module.__name__):
        steps = [stage.run(real_sql_batch(), global_step=step)[1] for step in (1, 2)]
    for metrics in steps:
        assert metrics["mrtpo/replay/dtype_fallbacks"] == 1 and metrics["mrtpo/replay/compute_dtype/tf32"] == 1
        assert metrics["mrtpo/replay/weights_dtype/fp32"] == 1
    named = [r.getMessage() for r in caplog.records if "dtype_fallbacks" in r.getMessage()]
    assert len(named) == 1 and "compute_dtype auto -> tf32 instead of fp16" in named[0], named
    assert steps[0][AUDIT] < 1e-4  # tf32 is float32 arithmetic on a CPU

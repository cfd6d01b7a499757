"""The start-up package's one entry: what each process checks, what it reads once, and the torch warning.

Real pieces throughout: the composed ``mrtpo_trainer`` config, SmolLM2's real model folder (one layer),
parquet data, ``transformers``' own config reader (counted, not replaced). The config crosses to the trainer
actor by pickling, as Ray carries it.
"""

from __future__ import annotations

import logging
import pickle
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import transformers

from mrtpo_verl.compat.torch_fsdp import TESTED_TORCH
from mrtpo_verl.config import MRTPOConfigError
from mrtpo_verl.startup import check_run
from mrtpo_verl.startup.torch_version import untested_torch
from tests.test_config_on_cpu import MULTI_REWARD_RUN, compose_trainer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SmolLM2's first layer as a model folder, and a parquet file with verl's prompt and data_source columns."""
    from mrtpo_cpu.launch import save_derived_model

    root = tmp_path_factory.mktemp("startup_inputs")
    model = save_derived_model(root / "model", num_layers=1)
    rows = [{"prompt": [{"role": "user", "content": f"question {i}"}], "data_source": "demo"} for i in range(4)]
    data = root / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    return {"model": model, "data": data}


def composed(paths: dict[str, Path], *overrides: str):
    return compose_trainer(
        *MULTI_REWARD_RUN,
        f"actor_rollout_ref.model.path={paths['model']}",
        f"data.train_files={paths['data']}",
        f"data.val_files={paths['data']}",
        "data.max_prompt_length=64",
        "data.max_response_length=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        *overrides,
    )


@pytest.fixture
def startup_config_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each ``AutoConfig.from_pretrained`` call made by the start-up package itself (the real reader runs)."""
    calls: list[str] = []
    real = transformers.AutoConfig.from_pretrained.__func__  # type: ignore[attr-defined]

    def counted(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("mrtpo_verl.startup"):
            calls.append(str(args[0]) if args else "")
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", classmethod(counted))
    return calls


def test_the_command_line_reads_the_model_config_once_and_hands_the_budget_on(
    run_inputs: dict[str, Path], startup_config_reads: list[str]
) -> None:
    """A dry run needs the model config for the replay's budget and for the model check: one read serves both."""
    config = composed(run_inputs, "mrtpo.dry_run=true")
    assert config.mrtpo.replay.max_context_tokens is None
    report = check_run(config, defaults=compose_trainer())
    assert report.inputs_checked and report.dry_run
    assert startup_config_reads == [str(run_inputs["model"])]
    assert report.mrtpo is not None and report.mrtpo.replay.max_context_tokens == 64 + 32 + 1024
    # Handed on: the config verl carries to its trainer actor holds the resolved budget.
    assert config.mrtpo.replay.max_context_tokens == report.mrtpo.replay.max_context_tokens
    assert config.mrtpo.replay.chat_template_kwargs == {}


def test_the_trainer_actor_parses_the_handed_on_block_without_reading_the_model(
    run_inputs: dict[str, Path], startup_config_reads: list[str]
) -> None:
    config = composed(run_inputs)
    on_cli = check_run(config, defaults=compose_trainer()).mrtpo
    startup_config_reads.clear()
    on_actor = check_run(pickle.loads(pickle.dumps(config)), process="trainer")
    assert startup_config_reads == []
    assert on_actor.mrtpo == on_cli and not on_actor.inputs_checked


def test_the_trainer_actor_resolves_a_budget_that_did_not_come_through_the_command_line(
    run_inputs: dict[str, Path], startup_config_reads: list[str]
) -> None:
    """verl's own ``main`` hands the trainer actor an unresolved block: it reads the model config once there."""
    report = check_run(composed(run_inputs), process="trainer")
    assert startup_config_reads == [str(run_inputs["model"])]
    assert report.mrtpo is not None and report.mrtpo.replay.max_context_tokens == 64 + 32 + 1024
    with pytest.raises(ValueError, match=r"process='driver' \(allowed: cli \| trainer\)"):
        check_run(composed(run_inputs), process="driver")  # type: ignore[arg-type]


def test_a_torch_outside_the_tested_versions_is_named_in_one_line() -> None:
    first, last = TESTED_TORCH
    for inside in (f"{first}.0", f"{last}.0+cpu", "2.11.0+cu128"):
        assert untested_torch(inside) is None, inside
    for outside in ("2.5.1", "2.14.0", "3.0.0.dev20260101", "nightly"):
        line = untested_torch(outside)
        assert line is not None and "\n" not in line, outside
        assert f"torch {outside} is outside {first}–{last}" in line


def test_the_command_line_warns_once_at_start_up_for_an_untested_torch(
    run_inputs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A torch 2.14 cannot be installed beside this venv's verl: its version string stands in for it."""
    monkeypatch.setattr(torch, "__version__", "2.14.0")
    with caplog.at_level(logging.WARNING):
        check_run(composed(run_inputs), defaults=compose_trainer())
    lines = [r.getMessage() for r in caplog.records if "torch 2.14.0" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    caplog.clear()
    monkeypatch.setattr(torch, "__version__", f"{TESTED_TORCH[1]}.0")
    with caplog.at_level(logging.WARNING):
        check_run(composed(run_inputs), defaults=compose_trainer())
    assert not [r for r in caplog.records if "is outside" in r.getMessage()]


def test_setup_py_allows_the_tested_torch_versions_and_no_other() -> None:
    """``setup.py``'s torch range is the seams' tested range: ``>=first,<last+1``."""
    text = (REPO / "setup.py").read_text(encoding="utf-8")
    found = re.search(r'"torch>=([\d.]+),<([\d.]+)"', text)
    assert found, "no torch>=...,<... requirement in setup.py"
    first, last = TESTED_TORCH
    major, minor = (int(part) for part in last.split("."))
    assert (found.group(1), found.group(2)) == (first, f"{major}.{minor + 1}")


def test_chat_template_kwargs_set_on_the_command_line_are_a_mapping(run_inputs: dict[str, Path]) -> None:
    """A mapping in the composed config (the user's, or the one the command line hands on) reads as a mapping."""
    config = composed(run_inputs, "mrtpo.replay.chat_template_kwargs={enable_thinking:false}")
    report = check_run(config, process="trainer")
    assert report.mrtpo is not None and report.mrtpo.replay.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("compute_dtype", ["fp16", "tf32"])
def test_reduced_precision_is_refused_at_start_up_for_a_mixture_of_experts_model(
    run_inputs: dict[str, Path], startup_config_reads: list[str], tmp_path: Path, compute_dtype: str
) -> None:
    """The experts' grouped_mm is outside the fp16/tf32 rule: refused from the model's config, read once; the same
    model with ``fp32`` or ``auto`` (which resolves to fp32 for experts) starts, and a dense model takes fp16/tf32."""
    folder = tmp_path / "moe"
    transformers.MixtralConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        max_position_embeddings=4096,
    ).save_pretrained(folder)
    moe = {**run_inputs, "model": folder}
    with pytest.raises(MRTPOConfigError) as refused:
        check_run(composed(moe, f"mrtpo.replay.compute_dtype={compute_dtype}"), defaults=compose_trainer())
    assert str(refused.value) == (
        f"mrtpo.replay.compute_dtype={compute_dtype} cannot apply its precision rule to this mixture-of-experts "
        "model (num_experts=4: transformers runs the experts through grouped_mm in the weights' dtype); "
        "use mrtpo.replay.compute_dtype fp32 or model"
    )
    assert startup_config_reads == [str(folder)]
    for allowed in ("fp32", "auto"):
        check_run(composed(moe, f"mrtpo.replay.compute_dtype={allowed}"), defaults=compose_trainer())
    check_run(composed(run_inputs, f"mrtpo.replay.compute_dtype={compute_dtype}"), defaults=compose_trainer())

"""A new user's mistakes, each run through ``python -m mrtpo_verl.main_ppo ... mrtpo.dry_run=true``.

Every mistake must end the process with exit status 2 and exactly one ``error: ...`` line, last on
stderr, naming the field, the value and the fix; no traceback, no hydra override dump, no config
on stdout. The run's inputs are real: SmolLM2 saved as a one-layer model folder, and the text-to-SQL
data written by ``recipes/data/prepare_text_to_sql.py``; the broken inputs are made from them.

Starting Python and importing verl takes ~8 s of CPU per process, so each probe runs in a child
*forked* from this (already warm) test process: the child sets ``sys.argv`` and runs the module as
``__main__`` exactly as ``python -m`` does (``runpy``), with its own stdout/stderr files and exit
status. A few probes also run as plain ``python -m`` subprocesses, and must print the same line.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # SmolLM2 saved as a model folder; ~35 runs of the CLI

REPO = Path(__file__).resolve().parents[1]
MODULE = "mrtpo_verl.main_ppo"
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


@dataclass(frozen=True)
class Outcome:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A valid model folder and data, and broken variants of each."""
    from mrtpo_cpu.launch import save_derived_model

    root = tmp_path_factory.mktemp("inputs")
    model = save_derived_model(root / "model", num_layers=1)
    data = root / "data"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "recipes/data/prepare_text_to_sql.py"),
            "--output-dir",
            str(data),
            "--max-samples",
            "8",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, **ENV},
    )
    frame = pd.read_parquet(data / "train.parquet")
    paths = {"model": model, "train": data / "train.parquet", "test": data / "test.parquet"}
    paths["not_parquet"] = root / "notes.parquet"
    paths["not_parquet"].write_text("question,answer\nhow many singers?,6\n")
    paths["no_ground_truth"] = root / "no_ground_truth.parquet"
    frame.drop(columns=["reward_model"]).to_parquet(paths["no_ground_truth"])
    paths["no_prompt"] = root / "no_prompt.parquet"
    frame.rename(columns={"prompt": "messages"}).to_parquet(paths["no_prompt"])
    paths["other_source"] = root / "gsm8k.parquet"
    frame.assign(data_source="openai/gsm8k").to_parquet(paths["other_source"])
    paths["bad_truth"] = root / "bad_truth.parquet"
    broken = frame.copy()
    broken.at[0, "reward_model"] = {**broken.at[0, "reward_model"], "ground_truth": json.dumps({"db_id": "nope"})}
    broken.to_parquet(paths["bad_truth"])
    paths["no_tokenizer"] = root / "weights_only"
    paths["no_tokenizer"].mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model / name, paths["no_tokenizer"] / name)
    return paths


def valid_overrides(paths: dict[str, Path]) -> list[str]:
    """A run that the dry run accepts: text-to-SQL rewards on the SmolLM2 folder, verl's sizes for 8 GPUs."""
    return [
        f"actor_rollout_ref.model.path={paths['model']}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['test']}",
        "reward.custom_reward_function.path=pkg://reward_fns.dispatch",
        "reward.custom_reward_function.name=compute_score",
        "+reward.custom_reward_function.reward_kwargs.families=[text_to_sql]",
        "mrtpo.reward_keys=[sql_format,sql_execution]",
        "mrtpo.verifier_info_keys=[sql_format_info,sql_execution_info]",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "mrtpo.dry_run=true",
    ]


#: id → (overrides after the valid ones, with {name} = a path of ``inputs``; what the error line must say).
MISTAKES: dict[str, tuple[tuple[str, ...], str]] = {
    "typo_in_an_mrtpo_field": (("mrtpo.bta=0.3",), "mrtpo.bta: no such key in the config (did you mean mrtpo.beta?)"),
    "typo_in_a_verl_field": (
        ("actor_rollout_ref.actor.optim.lrr=1e-6",),
        "actor_rollout_ref.actor.optim.lrr: no such key in the config (did you mean actor_rollout_ref.actor.optim.lr?)",
    ),
    "typo_in_a_replay_field": (
        ("mrtpo.replay.placment=dedicated",),
        "mrtpo.replay.placment: no such key in the config (did you mean mrtpo.replay.placement?)",
    ),
    "typo_in_a_block_name": (("mrtpo.replya.placement=dedicated",), "mrtpo.replya: no such key in the config"),
    "unparsable_override": (("mrtpo.beta=[0.3",), "override 'mrtpo.beta=[0.3' does not parse"),
    "misspelt_config_name": (("--config-name=mrtpo_trainr",), "Cannot find primary config 'mrtpo_trainr'"),
    "adding_an_existing_key": (("+mrtpo.beta=0.3",), "+mrtpo.beta: the key already exists"),
    "wrong_type_in_verl": (
        ("data.train_batch_size=abc",),
        "data.train_batch_size: got 'abc' (str) (allowed: an integer, as verl's default 1024)",
    ),
    "wrong_type_boolean": (("trainer.val_before_train=maybe",), "trainer.val_before_train: got 'maybe' (str)"),
    "wrong_type_in_mrtpo": (("mrtpo.warmup_steps=ten",), "mrtpo.warmup_steps: got 'ten' (allowed: an integer ≥ 0)"),
    "beta_above_one": (("mrtpo.beta=1.5",), "mrtpo.beta: got 1.5 (allowed: a number in [0, 1])"),
    "beta_negative": (("mrtpo.beta=-0.2",), "mrtpo.beta: got -0.2 (allowed: a number in [0, 1])"),
    "one_response_per_prompt": (
        ("actor_rollout_ref.rollout.n=1",),
        "actor_rollout_ref.rollout.n: 1 with adv_estimator",
    ),
    "unknown_reward_key": (
        ("mrtpo.reward_keys=[sql_format,sql_exec]", "mrtpo.verifier_info_keys=[sql_format_info,sql_exec_info]"),
        "mrtpo.reward_keys: unknown reward keys ['sql_exec'] (allowed: sql_format, sql_executability, sql_execution)",
    ),
    "verifier_info_keys_too_short": (
        ("mrtpo.verifier_info_keys=[sql_format_info]",),
        "mrtpo.verifier_info_keys: 1 names for 2 reward keys; missing for ['sql_execution']",
    ),
    "negative_micro_batch": (
        ("mrtpo.replay.micro_batch_size=-4",),
        "mrtpo.replay.micro_batch_size: got -4 (allowed: an integer ≥ 1)",
    ),
    "negative_response_length": (
        ("data.max_response_length=-1",),
        "data.max_response_length: got -1 (allowed: an integer ≥ 1)",
    ),
    "bad_placement": (("mrtpo.replay.placement=remote",), "mrtpo.replay.placement: got 'remote' (allowed: colocated"),
    "bad_incomplete_group_policy": (
        ("mrtpo.on_incomplete_group=skip",),
        "mrtpo.on_incomplete_group: got 'skip' (allowed: normalise | error)",
    ),
    "misspelt_estimator": (
        ("algorithm.adv_estimator=mrtp",),
        "algorithm.adv_estimator: 'mrtp' is not an estimator verl knows (did you mean 'mrtpo'?)",
    ),
    "unknown_trainer_mode": (
        ("trainer.v1.trainer_mode=mrtpo_fast",),
        "trainer.v1.trainer_mode: 'mrtpo_fast' with adv_estimator=mrtpo (allowed: mrtpo_sync",
    ),
    "verls_own_trainer_mode": (("trainer.v1.trainer_mode=sync",), "use 'mrtpo_sync'"),
    "batch_not_divisible_by_gpus": (
        ("data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3"),
        "verl's config check: real_train_batch_size (12) must be divisible by minimal possible batch size (8)",
    ),
    "dry_run_not_a_boolean": (("mrtpo.dry_run=yes",), "mrtpo.dry_run: got 'yes' (allowed: true | false)"),
    "missing_data_file": (
        ("data.train_files=/data/none/train.parquet",),
        "data.train_files: '/data/none/train.parquet'",
    ),
    "data_file_not_parquet": (("data.val_files={not_parquet}",), "is not a readable parquet file"),
    "data_without_ground_truth": (("data.train_files={no_ground_truth}",), "has no reward_model.ground_truth column"),
    "data_without_prompt_column": (("data.train_files={no_prompt}",), "has no column 'prompt' (data.prompt_key)"),
    "data_source_no_family_serves": (
        ("data.train_files={other_source}",),
        "has data_source='openai/gsm8k', which no configured reward family serves",
    ),
    "unreadable_ground_truth": (("data.train_files={bad_truth}",), "row 0 of"),
    "missing_model_path": (
        ("actor_rollout_ref.model.path=/models/qwen-3b",),
        "actor_rollout_ref.model.path: '/models/qwen-3b' does not exist",
    ),
    "model_not_in_the_offline_cache": (
        ("actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct-not-here",),
        "actor_rollout_ref.model.path: 'Qwen/Qwen2.5-0.5B-Instruct-not-here' has no readable model config",
    ),
    "model_folder_without_tokenizer": (
        ("actor_rollout_ref.model.path={no_tokenizer}",),
        "actor_rollout_ref.model.path: no tokenizer can be loaded from",
    ),
    "misspelt_reward_function": (
        ("reward.custom_reward_function.path=pkg://reward_fns.dispach",),
        "reward.custom_reward_function: 'compute_score' from 'pkg://reward_fns.dispach' cannot be loaded",
    ),
}
#: Also run as plain ``python -m`` subprocesses: a composition error, a start-up check, an input check.
SUBPROCESS_PROBES = ("typo_in_an_mrtpo_field", "beta_above_one", "missing_data_file")


def forked_cli(arguments: list[str], workdir: Path, env: dict[str, str]) -> Outcome:
    """Run ``python -m mrtpo_verl.main_ppo <arguments>`` in a child forked from this warm process."""
    workdir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = workdir / "stdout", workdir / "stderr"
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            for fd, path in ((1, out_path), (2, err_path)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115  (the child's own stdout)
            sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            from hydra.core.global_hydra import GlobalHydra

            GlobalHydra.instance().clear()
            os.chdir(workdir)
            os.environ.update(env)
            sys.argv = [MODULE, *arguments]
            try:
                runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return Outcome(os.waitstatus_to_exitcode(status), out_path.read_text(), err_path.read_text())


def subprocess_cli(arguments: list[str], workdir: Path, env: dict[str, str]) -> Outcome:
    workdir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", MODULE, *arguments],
        cwd=workdir,
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Outcome(result.returncode, result.stdout, result.stderr)


def arguments_for(name: str, inputs: dict[str, Path]) -> list[str]:
    extra = [override.format(**{k: str(v) for k, v in inputs.items()}) for override in MISTAKES[name][0]]
    return [*valid_overrides(inputs), *extra]


@pytest.fixture(scope="module")
def outcomes(inputs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every probe forked (one at a time), then the plain subprocesses.

    The plain ones run after the forks, not beside them in a thread: a fork while another thread holds a lock
    (logging, imports) could leave the child waiting forever.
    """
    work = tmp_path_factory.mktemp("runs")
    env = {key: value for key, value in ENV.items()}
    results = {name: forked_cli(arguments_for(name, inputs), work / name, env) for name in MISTAKES}
    results["valid"] = forked_cli(valid_overrides(inputs), work / "valid", env)
    results["traceback"] = forked_cli(
        arguments_for("beta_above_one", inputs), work / "traceback", {**env, "MRTPO_TRACEBACK": "1"}
    )
    for name in SUBPROCESS_PROBES:
        results[f"plain-{name}"] = subprocess_cli(arguments_for(name, inputs), work / f"plain-{name}", env)
    return results


def test_a_valid_run_passes_the_dry_run(outcomes: dict[str, Outcome]) -> None:
    valid = outcomes["valid"]
    assert valid.returncode == 0, valid.stderr[-3000:]
    assert "mrtpo: config valid (adv_estimator=mrtpo); dry run, nothing started" in valid.stdout
    assert not valid.error_lines


@pytest.mark.parametrize("name", list(MISTAKES))
def test_each_mistake_is_one_line_and_a_non_zero_exit(name: str, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[name]
    assert outcome.returncode == 2, outcome.stderr[-3000:]
    assert outcome.error_lines == [outcome.last_line], outcome.stderr[-3000:]  # exactly one, and last
    assert MISTAKES[name][1] in outcome.last_line, outcome.last_line
    assert "Traceback" not in outcome.stderr and "Error executing job" not in outcome.stderr
    assert "config valid" not in outcome.stdout and "actor_rollout_ref:" not in outcome.stdout  # no config printed


@pytest.mark.parametrize("name", SUBPROCESS_PROBES)
def test_plain_python_m_prints_the_same_line(name: str, outcomes: dict[str, Outcome]) -> None:
    plain = outcomes[f"plain-{name}"]
    assert plain.returncode == 2, plain.stderr[-3000:]
    assert plain.error_lines == [plain.last_line] == [outcomes[name].last_line]
    assert "Traceback" not in plain.stderr


def test_the_traceback_is_there_when_asked_for(outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes["traceback"]
    assert outcome.returncode == 2
    assert "Traceback (most recent call last)" in outcome.stderr and "MRTPOConfigError" in outcome.stderr
    assert outcome.last_line == outcomes["beta_above_one"].last_line  # the one line still comes last

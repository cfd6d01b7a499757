"""Every recipe script composes a valid config through our entry point (``mrtpo.dry_run=true``).

The scripts run as users run them (``bash recipes/<task>/run_<model>.sh ... mrtpo.dry_run=true``)
with the venv's ``python3`` first on PATH; each dry run imports verl (~6 s), so they run in a small
thread pool once per module and the tests read the results. Every script is run, every estimator
on every task, plus the multi-node submit command and the errors a typo or a bad value must give.

The dry run checks what the run would read, so the runs get real inputs: ``MODEL_PATH`` is SmolLM2
saved as a one-layer model folder (the scripts' own defaults are Hub ids, which are checked from the
script text), and each family's data is written by its ``recipes/data/prepare_<task>.py`` into the
default ``$HOME/data/mrtpo/<task>/``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from reward_fns import dispatch

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "recipes"
DONE_LINE = re.compile(r"^mrtpo: config valid \(adv_estimator=(\w+)\)", re.MULTILINE)

# Every run script, with the model it trains; the task folder names the reward family.
MODELS = {
    "text_to_sql/run_qwen2_5_coder_3b.sh": "Qwen/Qwen2.5-Coder-3B-Instruct",
    "text_to_sql/run_qwen2_5_coder_7b.sh": "Qwen/Qwen2.5-Coder-7B-Instruct",
    "tool_calling/run_qwen2_5_1_5b.sh": "Qwen/Qwen2.5-1.5B-Instruct",
    "tool_calling/run_qwen2_5_3b.sh": "Qwen/Qwen2.5-3B-Instruct",
    "instruction_following/run_qwen2_5_7b.sh": "Qwen/Qwen2.5-7B-Instruct",
    "instruction_following/run_qwen3_4b_instruct_2507.sh": "Qwen/Qwen3-4B-Instruct-2507",
    # Asynchronous variants (verl's colocate_async by default, separate_async multi-node).
    "text_to_sql/run_qwen2_5_coder_7b_async.sh": "Qwen/Qwen2.5-Coder-7B-Instruct",
    "tool_calling/run_qwen2_5_3b_async.sh": "Qwen/Qwen2.5-3B-Instruct",
    "instruction_following/run_qwen2_5_7b_async.sh": "Qwen/Qwen2.5-7B-Instruct",
}
ESTIMATORS = ("mrtpo", "gdpo", "grpo")


@dataclass(frozen=True)
class Case:
    """One dry run of one script; env holds the knobs set for it."""

    script: str
    estimator: str
    env: dict[str, str] = field(default_factory=dict)
    overrides: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        mode = self.env.get("TRAINER_MODE", "").replace("mrtpo_", "-")
        return f"{Path(self.script).stem}-{self.estimator}{mode}"

    @property
    def family(self) -> str:
        return self.script.split("/")[0]

    @property
    def trainer_mode(self) -> str:
        default = "mrtpo_colocate_async" if self.script.endswith("_async.sh") else "mrtpo_sync"
        return self.env.get("TRAINER_MODE", default)


# Each script once; each task with all three estimators; some knobs changed on the way.
CASES = [
    Case("text_to_sql/run_qwen2_5_coder_3b.sh", "mrtpo"),
    Case("text_to_sql/run_qwen2_5_coder_7b.sh", "gdpo", {"NNODES": "4"}),
    Case("text_to_sql/run_qwen2_5_coder_3b.sh", "grpo"),
    Case("tool_calling/run_qwen2_5_1_5b.sh", "gdpo"),
    Case("tool_calling/run_qwen2_5_3b.sh", "mrtpo", {}, ("trainer.total_epochs=1",)),
    Case("tool_calling/run_qwen2_5_1_5b.sh", "grpo"),
    Case("instruction_following/run_qwen2_5_7b.sh", "mrtpo"),
    Case("instruction_following/run_qwen3_4b_instruct_2507.sh", "gdpo", {"IF_MAX_CONSTRAINTS": "5"}),
    Case("instruction_following/run_qwen2_5_7b.sh", "grpo"),
    # The asynchronous variants: one node (colocate_async) and multi-node (separate_async, rollout on its own nodes).
    Case("text_to_sql/run_qwen2_5_coder_7b_async.sh", "mrtpo"),
    Case(
        "tool_calling/run_qwen2_5_3b_async.sh",
        "gdpo",
        {"TRAINER_MODE": "mrtpo_separate_async", "NNODES": "2", "ROLLOUT_NNODES": "2"},
    ),
    Case("instruction_following/run_qwen2_5_7b_async.sh", "mrtpo", {"TRAINER_MODE": "mrtpo_separate_async"}),
    Case("instruction_following/run_qwen2_5_7b_async.sh", "grpo"),
]
BAD_OVERRIDES = {
    "misspelt_mrtpo_key": ("mrtpo.bta=0.3", "error: mrtpo.bta: no such key in the config (did you mean mrtpo.beta?)"),
    "misspelt_verl_key": (
        "actor_rollout_ref.actor.optim.lrr=1",
        "error: actor_rollout_ref.actor.optim.lrr: no such key",
    ),
    "beta_out_of_range": ("mrtpo.beta=2", "error: mrtpo.beta: got 2"),
}
SUBMITTED = ("tool_calling/run_qwen2_5_3b.sh", {"NNODES": "2", "ADV_ESTIMATOR": "gdpo", "LR": "2e-6"})


@functools.cache
def recipe_knobs() -> frozenset[str]:
    """Every ``${VAR:-default}`` the recipes read; cleared so that the caller's shell cannot leak in."""
    text = "".join(path.read_text() for path in RECIPES.rglob("*.sh"))
    return frozenset(re.findall(r"\$\{([A-Z][A-Z0-9_]*):[-?]", text))


def clean_env(home: Path, **knobs: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in recipe_knobs()}
    env |= {"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}", "HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return env | knobs


def run(command: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


def dry_run(script: str, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess[str]:
    # Run from the temporary HOME: hydra writes its outputs/ folder into the working directory.
    return run(["bash", str(RECIPES / script), *overrides, "mrtpo.dry_run=true"], env, cwd=Path(env["HOME"]))


def printed_config(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The resolved config the dry run printed (stdout: the yaml, then one closing line)."""
    assert result.returncode == 0, result.stderr[-3000:]
    done = DONE_LINE.search(result.stdout)
    assert done, result.stdout[-2000:]
    config: dict[str, Any] = yaml.safe_load(result.stdout[: done.start()])
    assert config["algorithm"]["adv_estimator"] == done.group(1)
    return config


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A HOME with every family's data where the recipes look for it (``$HOME/data/mrtpo/<task>``)."""
    home = tmp_path_factory.mktemp("home")
    for family in ("text_to_sql", "tool_calling", "instruction_following"):
        script = RECIPES / "data" / f"prepare_{family}.py"
        output = home / "data" / "mrtpo" / family
        run([sys.executable, str(script), "--output-dir", str(output), "--max-samples", "8"], clean_env(home))
        assert (output / "train.parquet").is_file() and (output / "test.parquet").is_file(), family
    return home


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    from mrtpo_cpu.launch import save_derived_model

    return str(save_derived_model(tmp_path_factory.mktemp("model"), num_layers=1))


@pytest.fixture(scope="module")
def submit_command(home: Path) -> list[str]:
    """The ``ray job submit`` command that submit.sh would run (PRINT_ONLY=1)."""
    script, knobs = SUBMITTED
    env = clean_env(home, PRINT_ONLY="1", **knobs)
    result = run(
        ["bash", str(RECIPES / "multinode" / "submit.sh"), str(RECIPES / script), "trainer.val_before_train=False"], env
    )
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout)


@pytest.fixture(scope="module")
def results(home: Path, model_path: str, submit_command: list[str]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every dry run of this module, run two at a time (2 CPU cores)."""
    model = {"MODEL_PATH": model_path}
    jobs = {
        case.id: (case.script, clean_env(home, ADV_ESTIMATOR=case.estimator, **model, **case.env), case.overrides)
        for case in CASES
    }
    jobs |= {name: (CASES[0].script, clean_env(home, **model), (bad,)) for name, (bad, _) in BAD_OVERRIDES.items()}
    # The submitted entry point, run here in the job's working dir with the job's env_vars.
    runtime_env = json.loads(submit_command[submit_command.index("--runtime-env-json") + 1])
    entry = submit_command[submit_command.index("--") + 1 :]
    jobs["submitted"] = (
        str(Path(runtime_env["working_dir"]) / entry[1]),
        clean_env(home, **model, **runtime_env["env_vars"]),
        tuple(entry[2:]),
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(dry_run, script, env, *ovr) for name, (script, env, ovr) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def test_every_run_script_is_covered() -> None:
    on_disk = {str(path.relative_to(RECIPES)) for path in RECIPES.glob("*/run_*.sh")}
    assert on_disk == set(MODELS)
    assert {case.script for case in CASES} == set(MODELS)
    assert {(case.family, case.estimator) for case in CASES} == {
        (Path(s).parent.name, e) for s in MODELS for e in ESTIMATORS
    }


def test_readme_documents_every_combination() -> None:
    readme = (RECIPES / "README.md").read_text()
    for script in MODELS:
        assert f"`bash recipes/{script}`" in readme
        for estimator in ("gdpo", "grpo"):
            assert f"`ADV_ESTIMATOR={estimator} bash recipes/{script}`" in readme


def test_shell_scripts_parse() -> None:
    for path in RECIPES.rglob("*.sh"):
        assert run(["bash", "-n", str(path)], os.environ.copy()).returncode == 0, path


def expected_reward_keys(case: Case) -> list[str]:
    slots = int(case.env.get("IF_MAX_CONSTRAINTS", 3)) if case.family == "instruction_following" else None
    return list(dispatch.reward_keys([case.family], slots))


def check_recipe_config(config: dict[str, Any], case: Case, home: Path, model_path: str) -> None:
    keys = expected_reward_keys(case)
    actor, rollout = config["actor_rollout_ref"]["actor"], config["actor_rollout_ref"]["rollout"]
    reward_fn = config["reward"]["custom_reward_function"]
    assert config["algorithm"]["adv_estimator"] == case.estimator
    assert config["actor_rollout_ref"]["model"]["path"] == model_path
    assert config["trainer"]["v1"]["trainer_mode"] == case.trainer_mode  # baselines on the same trainer path
    check_trainer_mode(config, case)
    assert config["mrtpo"]["reward_keys"] == keys == config["algorithm"]["gdpo_reward_keys"]
    assert config["mrtpo"]["verifier_info_keys"] == [dispatch.info_key(key) for key in keys]
    assert (reward_fn["path"], reward_fn["name"]) == ("pkg://reward_fns.dispatch", "compute_score")
    assert reward_fn["reward_kwargs"]["families"] == [case.family]
    if case.family == "instruction_following":
        assert reward_fn["reward_kwargs"]["max_constraints"] == len(keys)
    # The paper's Table 9.
    assert (config["mrtpo"]["beta"], config["mrtpo"]["warmup_steps"]) == (0.5, 10)
    assert (actor["optim"]["optimizer"], actor["optim"]["betas"]) == ("AdamW", [0.9, 0.999])
    assert rollout["name"] == "vllm" and rollout["n"] >= 2
    data_dir = home / "data" / "mrtpo" / case.family
    assert (config["data"]["train_files"], config["data"]["val_files"]) == (
        str(data_dir / "train.parquet"),
        str(data_dir / "test.parquet"),
    )
    assert config["trainer"]["nnodes"] == int(case.env.get("NNODES", 1))
    assert config["trainer"]["n_gpus_per_node"] == int(case.env.get("GPUS_PER_NODE", 8))
    assert config["trainer"]["experiment_name"].endswith(f"_{case.estimator}")


def check_trainer_mode(config: dict[str, Any], case: Case) -> None:
    """verl's settings of the mode: off-policy bound for both async modes; separate_async's pool and sync rule."""
    v1, rollout = config["trainer"]["v1"], config["actor_rollout_ref"]["rollout"]
    if case.trainer_mode == "mrtpo_sync":
        return
    assert v1["sampler"]["max_off_policy_threshold"] == 2
    if case.trainer_mode == "mrtpo_separate_async":
        mini = config["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"]
        assert config["data"]["train_batch_size"] == v1["separate_async"]["parameter_sync_step"] * mini
        assert rollout["checkpoint_engine"]["backend"] == "nccl"
        assert rollout["nnodes"] == int(case.env.get("ROLLOUT_NNODES", case.env.get("NNODES", 1)))
        assert rollout["n_gpus_per_node"] == 8


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_recipe_dry_run(
    case: Case, results: dict[str, subprocess.CompletedProcess[str]], home: Path, model_path: str
) -> None:
    config = printed_config(results[case.id])
    check_recipe_config(config, case, home, model_path)
    for override in case.overrides:
        path, value = override.split("=", 1)
        assert str(OmegaConf.select(OmegaConf.create(config), path)) == value


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_recipe_passes_verls_own_config_check(case: Case, results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """verl's main runs validate_config (batch-size divisibility, micro-batch settings) before Ray."""
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = OmegaConf.create(printed_config(results[case.id]))
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))


@pytest.mark.parametrize("name", list(BAD_OVERRIDES))
def test_bad_override_fails_with_a_clear_error(name: str, results: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = results[name]
    assert result.returncode == 2
    last = [line for line in result.stderr.splitlines() if line.strip()][-1]
    assert last.startswith(BAD_OVERRIDES[name][1]), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not DONE_LINE.search(result.stdout)


@pytest.mark.parametrize("script", list(MODELS))
def test_each_script_defaults_to_its_model(script: str) -> None:
    """The model each script trains when MODEL_PATH is not set (the dry runs above set it to a local folder)."""
    path = RECIPES / script
    text = path.read_text()
    # An asynchronous variant sources its synchronous script, which sets the model.
    sourced = re.search(r'source "\$\(dirname "\$\{BASH_SOURCE\[0\]\}"\)/(run_\w+\.sh)"', text)
    if sourced:
        text = (path.parent / sourced.group(1)).read_text()
    assert f"MODEL_PATH=${{MODEL_PATH:-{MODELS[script]}}}" in text


def test_multinode_submit_command(
    submit_command: list[str], results: dict[str, subprocess.CompletedProcess[str]], home: Path, model_path: str
) -> None:
    script, knobs = SUBMITTED
    assert submit_command[:3] == ["ray", "job", "submit"]
    assert submit_command[submit_command.index("--address") + 1] == "http://127.0.0.1:8265"
    runtime_env = json.loads(submit_command[submit_command.index("--runtime-env-json") + 1])
    assert runtime_env["working_dir"] == str(REPO) and ".venv" in runtime_env["excludes"]
    assert runtime_env["env_vars"] == {**knobs, "GPUS_PER_NODE": "8"}
    assert submit_command[submit_command.index("--") + 1 :] == [
        "bash",
        f"recipes/{script}",
        "trainer.val_before_train=False",
    ]
    config = printed_config(results["submitted"])
    check_recipe_config(config, Case(script, "gdpo", {"NNODES": "2"}), home, model_path)
    assert config["actor_rollout_ref"]["actor"]["optim"]["lr"] == 2e-6
    assert config["trainer"]["val_before_train"] is False

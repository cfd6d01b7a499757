"""The `mrtpo:` block: composes on verl's ppo_trainer with hydra, and every bad value names its field."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.trainer.config import AlgoConfig
from verl.utils.config import omega_conf_to_dataclass

from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError

KEYS = ["sql_format", "sql_executability", "sql_execution"]
INFO = [f"{k}_info" for k in KEYS]
#: Overrides of a run that start-up validation accepts (rewards, verifier information, groups of 4).
MULTI_REWARD_RUN = (
    f"mrtpo.reward_keys=[{','.join(KEYS)}]",
    f"mrtpo.verifier_info_keys=[{','.join(INFO)}]",
    "actor_rollout_ref.rollout.n=4",
)


def compose_trainer(*overrides: str):
    with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
        return compose(config_name="mrtpo_trainer", overrides=list(overrides))


def test_yaml_composes_on_verls_ppo_trainer_and_validates() -> None:
    cfg = compose_trainer(
        f"mrtpo.reward_keys=[{','.join(KEYS)}]",
        f"mrtpo.verifier_info_keys=[{','.join(INFO)}]",
        "actor_rollout_ref.rollout.temperature=0.7",
    )
    # verl's own defaults are there (the yaml holds only deltas) ...
    assert cfg.actor_rollout_ref.actor.optim.lr is not None and "critic" in cfg and "trainer" in cfg
    # ... our deltas applied, and mirrored into verl's gdpo fields so the baseline sees the same rewards.
    assert cfg.algorithm.adv_estimator == "mrtpo"
    algo = omega_conf_to_dataclass(cfg.algorithm)
    assert isinstance(algo, AlgoConfig) and list(algo.gdpo_reward_keys) == KEYS
    mrtpo = MRTPOConfig.from_block(cfg.mrtpo)
    assert mrtpo.reward_keys == tuple(KEYS) and mrtpo.verifier_info_keys == tuple(INFO)
    assert (mrtpo.beta, mrtpo.warmup_steps, mrtpo.ratio_cap, mrtpo.ablation) == (0.5, 10, None, "none")
    assert mrtpo.replay.temperature == 0.7  # follows the rollout temperature by default
    assert mrtpo.weights_or_ones == (1.0, 1.0, 1.0)


def test_yaml_defaults_match_the_dataclass_defaults() -> None:
    """One source of truth: the yaml documents each default; the dataclass must agree with it."""
    cfg = compose_trainer(
        "mrtpo.reward_keys=[a]", "mrtpo.verifier_info_keys=[a_info]", "actor_rollout_ref.rollout.temperature=1.0"
    )
    from_yaml = MRTPOConfig.from_block(cfg.mrtpo)
    assert from_yaml == MRTPOConfig(reward_keys=("a",), verifier_info_keys=("a_info",))


def test_every_field_in_the_yaml_has_a_comment() -> None:
    from importlib.resources import files

    lines = (files("mrtpo_verl.configs") / "mrtpo_trainer.yaml").read_text().splitlines()
    block = lines[lines.index("mrtpo:") + 1 :]
    for i, line in enumerate(block):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            assert block[i - 1].strip().startswith("#") or stripped == "replay:", f"no comment above {stripped!r}"


def valid_block(**changes: object) -> dict:
    block = {"reward_keys": list(KEYS), "verifier_info_keys": list(INFO)}
    block.update(changes)
    return block


@pytest.mark.parametrize(
    ("changes", "field", "allowed"),
    [
        ({"beta": 1.5}, "mrtpo.beta", "a number in [0, 1]"),
        ({"beta": -0.1}, "mrtpo.beta", "a number in [0, 1]"),
        ({"warmup_steps": -1}, "mrtpo.warmup_steps", "an integer ≥ 0"),
        ({"warmup_steps": 2.5}, "mrtpo.warmup_steps", "an integer ≥ 0"),
        ({"ratio_cap": 0.5}, "mrtpo.ratio_cap", "null, or a number > 1"),
        ({"reward_keys": ["a", "b", "a"], "verifier_info_keys": ["x", "y", "z"]}, "mrtpo.reward_keys", "each key once"),
        ({"reward_keys": []}, "mrtpo.reward_keys", "a non-empty list"),
        ({"verifier_info_keys": INFO[:2]}, "mrtpo.verifier_info_keys", "one non_tensor_batch key per reward key"),
        ({"verifier_info_keys": []}, "mrtpo.verifier_info_keys", "a non-empty list"),
        ({"verifier_info_keys": [INFO[0]] * 3}, "mrtpo.verifier_info_keys", "each key once"),
        ({"reward_weights": [1.0]}, "mrtpo.reward_weights", "one finite number per reward key"),
        ({"reward_weights": [1.0, float("nan"), 1.0]}, "mrtpo.reward_weights", "finite numbers"),
        ({"ablation": "random"}, "mrtpo.ablation", "none | uniform | shuffle"),
        ({"reweighting": "gdpo"}, "mrtpo.reweighting", "none | saw"),
        ({"betta": 0.5}, "mrtpo.betta", "reward_keys"),
        ({"replay": {"placement": "remote"}}, "mrtpo.replay.placement", "colocated | dedicated"),
        ({"replay": {"micro_batch_size": 0}}, "mrtpo.replay.micro_batch_size", "an integer ≥ 1"),
        ({"replay": {"temperature": 0}}, "mrtpo.replay.temperature", "a number > 0"),
        ({"replay": {"chunk": 3}}, "mrtpo.replay.chunk", "js_chunk_size"),
        ({"replay": {"on_worker_failure": "ignore"}}, "mrtpo.replay.on_worker_failure", "error | uniform"),
        ({"replay": {"verifier_item_template": "{name}"}}, "mrtpo.replay.verifier_item_template", "{info}"),
        ({"replay": {"max_cache_bytes": 0}}, "mrtpo.replay.max_cache_bytes", "null = 4294967296 bytes, or an integer"),
        ({"replay": {"max_cache_tokens": 2.5}}, "mrtpo.replay.max_cache_tokens", "null, or an integer ≥ 1"),
        (
            {"replay": {"max_cache_tokens": 65536, "max_cache_bytes": 2**30}},
            "mrtpo.replay.max_cache_tokens",
            "one of the two; max_cache_bytes derives the token budget from the model",
        ),
    ],
)
def test_bad_values_name_the_field_and_the_allowed_values(changes: dict, field: str, allowed: str) -> None:
    with pytest.raises(MRTPOConfigError) as error:
        MRTPOConfig.from_block(valid_block(**changes))
    message = str(error.value)
    assert message.startswith(field + ":"), message
    assert allowed in message


def test_unknown_reward_keys_against_what_the_reward_function_returns() -> None:
    with pytest.raises(MRTPOConfigError, match=r"mrtpo.reward_keys: unknown reward keys \['sql_execution'\]"):
        MRTPOConfig.from_block(valid_block(), known_reward_keys=["sql_format", "sql_executability"])
    MRTPOConfig.from_block(valid_block(), known_reward_keys=[*KEYS, "tool_format"])


def test_omegaconf_block_is_accepted() -> None:
    block = OmegaConf.create(valid_block(beta=0.3, replay={"micro_batch_size": 2}))
    cfg = MRTPOConfig.from_block(block)
    assert cfg.beta == 0.3 and cfg.replay.micro_batch_size == 2


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy", "fsdp2"),
        (["actor_rollout_ref.actor.strategy=megatron"], "actor_rollout_ref.actor.strategy", "fsdp2"),
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], "ulysses_sequence_parallel_size", "1"),
    ],
)
def test_colocated_replay_refuses_actor_engines_it_cannot_run_on(overrides: list, field: str, allowed: str) -> None:
    from mrtpo_verl.startup import validate_run_config

    keys = MULTI_REWARD_RUN
    with pytest.raises(MRTPOConfigError, match=rf"{field}: .*colocated \(allowed: {allowed}\)"):
        validate_run_config(compose_trainer(*keys, *overrides))
    # The same engine is fine for the dedicated placement, and for the baselines.
    assert validate_run_config(compose_trainer(*keys, *overrides, "mrtpo.replay.placement=dedicated")) is not None
    assert validate_run_config(compose_trainer(*keys, *overrides, "algorithm.adv_estimator=gdpo")) is not None


def test_the_default_config_runs_the_colocated_replay_on_fsdp2() -> None:
    from mrtpo_verl.startup import validate_run_config

    cfg = compose_trainer(*MULTI_REWARD_RUN)
    assert cfg.actor_rollout_ref.actor.strategy == "fsdp2" and cfg.actor_rollout_ref.ref.strategy == "fsdp2"
    mrtpo = validate_run_config(cfg)
    assert mrtpo is not None and mrtpo.replay.placement == "colocated"


#: Our reward function as verl's custom reward, with the text-to-SQL family only.
OUR_REWARD = (
    "reward.custom_reward_function.path=pkg://reward_fns.dispatch",
    "reward.custom_reward_function.name=compute_score",
    "+reward.custom_reward_function.reward_kwargs.families=[text_to_sql]",
)


@pytest.mark.parametrize(
    ("setting", "field", "problem"),
    [
        ("timeout_s=0", "timeout_s", "positive number of seconds"),
        ("timeout_s=-3", "timeout_s", "positive number of seconds"),
        ("timeout_s=soon", "timeout_s", "positive number of seconds"),
        ("sandbox_workers=0", "sandbox_workers", "must be an integer ≥ 1"),
        ("sandbox_memory_bytes=1.5", "sandbox_memory_bytes", "must be an integer ≥ 268435456"),
        ("isolation=thread", "isolation", "unknown isolation 'thread'"),
        ("isolation=inprocess", "isolation", "in-process checks have no deadline"),
    ],
)
def test_reward_deadline_settings_are_checked_at_start_up(setting: str, field: str, problem: str) -> None:
    """A bad deadline or pool setting of our reward function is a start-up error, whatever the estimator."""
    from mrtpo_verl.startup import validate_run_config

    for estimator in ("mrtpo", "grpo"):
        cfg = compose_trainer(
            *MULTI_REWARD_RUN,
            *OUR_REWARD,
            f"algorithm.adv_estimator={estimator}",
            f"+reward.custom_reward_function.reward_kwargs.{setting}",
        )
        with pytest.raises(MRTPOConfigError, match=rf"reward_kwargs\.{field}: .*{problem}"):
            validate_run_config(cfg)


def test_valid_reward_deadline_settings_pass() -> None:
    from mrtpo_verl.startup import validate_run_config

    overrides = [f"+reward.custom_reward_function.reward_kwargs.{s}" for s in ("timeout_s=2.5", "sandbox_workers=3")]
    cfg = compose_trainer(*MULTI_REWARD_RUN, *OUR_REWARD, *overrides, "algorithm.adv_estimator=grpo")
    assert validate_run_config(cfg) is None


def test_value_types_follow_verls_dataclasses_where_the_yaml_writes_an_integer() -> None:
    """verl's yaml writes ``top_p: 1`` and ``entropy_coeff: 0``; its dataclasses declare them floats."""
    from mrtpo_verl.startup.mistakes import ConfigMistake
    from mrtpo_verl.startup.verl_config import check_value_types

    defaults = compose_trainer()
    floats = (
        "actor_rollout_ref.rollout.top_p=0.9",
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0.6",
    )
    check_value_types(compose_trainer(*floats), defaults)
    with pytest.raises(ConfigMistake, match=r"actor_rollout_ref.rollout.top_p: got 'high' .*allowed: a number"):
        check_value_types(compose_trainer("actor_rollout_ref.rollout.top_p=high"), defaults)
    with pytest.raises(ConfigMistake, match=r"data.train_batch_size: got 1.5 .*allowed: an integer"):
        check_value_types(compose_trainer("data.train_batch_size=1.5"), defaults)


def test_the_dry_run_reads_json_data_files_as_verl_does(tmp_path) -> None:
    """verl's RLHFDataset reads .json/.jsonl besides parquet: the dry run checks them with the same rules."""
    import json

    from mrtpo_verl.startup.inputs import check_data_file
    from mrtpo_verl.startup.mistakes import ConfigMistake

    config = compose_trainer(*MULTI_REWARD_RUN)
    row = {"prompt": [{"role": "user", "content": "hi"}], "data_source": "spider"}
    lines = tmp_path / "train.jsonl"
    lines.write_text("\n".join(json.dumps(row) for _ in range(3)) + "\n")
    array = tmp_path / "train.json"
    array.write_text(json.dumps([row, row]))
    for path in (lines, array):
        check_data_file(config, "data.train_files", str(path), None)
    no_prompt = tmp_path / "no_prompt.jsonl"
    no_prompt.write_text(json.dumps({"question": "hi", "data_source": "spider"}) + "\n")
    with pytest.raises(ConfigMistake, match=r"data.train_files: .* has no column 'prompt'"):
        check_data_file(config, "data.train_files", str(no_prompt), None)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigMistake, match=r"is not a readable JSON file"):
        check_data_file(config, "data.train_files", str(broken), None)


def test_cache_budget_is_bytes_by_default_or_one_explicit_field() -> None:
    replay = MRTPOConfig.from_block(valid_block()).replay
    assert (replay.max_cache_bytes, replay.max_cache_tokens) == (None, None)  # the scorer uses 4 GiB
    assert MRTPOConfig.from_block(valid_block(replay={"max_cache_bytes": 2**31})).replay.max_cache_bytes == 2**31
    assert MRTPOConfig.from_block(valid_block(replay={"max_cache_tokens": 512})).replay.max_cache_tokens == 512

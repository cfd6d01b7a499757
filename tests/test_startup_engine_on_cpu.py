"""Start-up check of verl's actor-engine options against the colocated replay: refused in one line, or let through.

On verl's real composed config (``mrtpo_trainer.yaml`` over verl's ``ppo_trainer``). Start-up decides only the rows it
refuses: a strategy other than ``fsdp2`` and Ulysses sequence parallelism. Every other option of docs/design.md's
engine-option matrix is *not checked at start-up*: the check derives nothing from it, which the test of those options
asserts (the validated block is the same with and without the option, and the option did land in the composed
config). Whether the colocated replay works with each of them is shown on verl's real FSDP2 engine, one option at a
time, in tests/trainer/test_colocated_engine_options_on_cpu.py (and, for what needs a GPU, by ``benchmarks.gpu_check``;
docs/verification.md).
"""

from __future__ import annotations

import pytest

from mrtpo_verl.config import MRTPOConfigError
from tests.test_config_on_cpu import MULTI_REWARD_RUN, compose_trainer

REFUSED = [
    (["actor_rollout_ref.actor.strategy=megatron"], "actor_rollout_ref.actor.strategy: 'megatron'", "Megatron"),
    (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy: 'fsdp'", "FSDP2"),
    (
        ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size: 2",
        "sequence-parallel",
    ),
    (
        ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4"],
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size: 4",
        "sequence-parallel",
    ),
]

MODEL, FSDP = "actor_rollout_ref.model", "actor_rollout_ref.actor.fsdp_config"
ACCEPTED = [
    ["actor_rollout_ref.model.use_fused_kernels=true", "actor_rollout_ref.actor.use_fused_kernels=true"],
    [
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=triton",
        "actor_rollout_ref.model.use_fused_kernels=true",
    ],
    ["actor_rollout_ref.model.use_remove_padding=true"],
    ["actor_rollout_ref.model.enable_gradient_checkpointing=true"],
    [
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
    ],
    ["actor_rollout_ref.actor.fsdp_config.offload_policy=true"],
    ["actor_rollout_ref.actor.use_torch_compile=true", "actor_rollout_ref.actor.fsdp_config.use_torch_compile=true"],
    ["actor_rollout_ref.model.lora_rank=8"],
    ["actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"],
    [
        "actor_rollout_ref.actor.fsdp_config.model_dtype=fp16",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp16",
    ],
]


@pytest.mark.parametrize(("overrides", "head", "why"), REFUSED)
def test_refused_options_name_the_field_the_value_and_the_dedicated_placement(
    overrides: list[str], head: str, why: str
) -> None:
    from mrtpo_verl.startup import validate_run_config

    with pytest.raises(MRTPOConfigError) as error:
        validate_run_config(compose_trainer(*MULTI_REWARD_RUN, *overrides))
    message = str(error.value)
    assert message.startswith(head) and "\n" not in message, message
    assert why in message and "mrtpo.replay.placement=dedicated" in message, message
    # The dedicated placement runs its own model copy: the same engine options are fine there.
    assert validate_run_config(compose_trainer(*MULTI_REWARD_RUN, *overrides, "mrtpo.replay.placement=dedicated"))


@pytest.fixture(scope="module")
def plain_block():
    """The block start-up returns for the run without any of the options."""
    from mrtpo_verl.startup import validate_run_config

    return validate_run_config(compose_trainer(*MULTI_REWARD_RUN))


@pytest.mark.parametrize("overrides", ACCEPTED, ids=lambda overrides: overrides[0].rsplit(".", 1)[-1])
def test_options_start_up_does_not_check_are_let_through_and_change_nothing(overrides: list[str], plain_block) -> None:
    """Start-up reads no accepted option: the block it returns is the one it returns without the option (so an option
    that start-up began to refuse, or to derive a replay setting from, fails here), and the option is in the config
    start-up saw (a misspelt override would leave the default and prove nothing)."""
    from omegaconf import OmegaConf

    from mrtpo_verl.startup import validate_run_config

    config = compose_trainer(*MULTI_REWARD_RUN, *overrides)
    for override in overrides:
        field, value = override.lstrip("+").split("=", 1)
        assert str(OmegaConf.select(config, field)).lower() == value.lower(), override
    mrtpo = validate_run_config(config)
    assert mrtpo is not None and mrtpo.replay.placement == "colocated"
    assert mrtpo == plain_block


def test_a_sequence_parallel_size_that_is_not_an_integer_is_one_line() -> None:
    from mrtpo_verl.startup import validate_run_config

    overrides = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=two",)
    expected = r"ulysses_sequence_parallel_size: got 'two' \(allowed: an integer ≥ 1\)"
    with pytest.raises(MRTPOConfigError, match=expected):
        validate_run_config(compose_trainer(*MULTI_REWARD_RUN, *overrides))

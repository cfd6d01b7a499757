"""Start-up resolution of the replay budget from verl's lengths and the model's maximum position (no weights loaded).

On verl's real composed config (``mrtpo_trainer.yaml`` over ``ppo_trainer``) with the real SmolLM2-135M-Instruct
config (maximum position 8192), read once from the embedded GGUF file and saved as a model folder's config.json.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from transformers import AutoConfig

from mrtpo_verl.config import MRTPOConfigError
from mrtpo_verl.replay.model_loading import EMBEDDED_GGUF_FILE, embedded_model_dir
from mrtpo_verl.startup import validate_run_config
from mrtpo_verl.startup.lengths import model_max_positions
from tests.test_config_on_cpu import MULTI_REWARD_RUN, compose_trainer

SMOLLM2_MAX_POSITIONS = 8192
GGUF_PATH = embedded_model_dir() / EMBEDDED_GGUF_FILE


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder holding only SmolLM2's real config.json (enough: the check loads no weights)."""
    folder = tmp_path_factory.mktemp("smollm2_config")
    AutoConfig.from_pretrained(str(GGUF_PATH.parent), gguf_file=GGUF_PATH.name).save_pretrained(folder)
    return folder


def run(model: Path | str, *overrides: str):
    return compose_trainer(*MULTI_REWARD_RUN, f"actor_rollout_ref.model.path={model}", *overrides)


def lengths(prompt: int, response: int) -> tuple[str, str]:
    return f"data.max_prompt_length={prompt}", f"data.max_response_length={response}"


def test_auto_budget_is_verls_lengths_plus_the_verifier_allowance(model_folder: Path) -> None:
    mrtpo = validate_run_config(run(model_folder, *lengths(512, 1024)))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == 512 + 1024 + 1024
    mrtpo = validate_run_config(run(model_folder, *lengths(512, 1024), "mrtpo.replay.verifier_block_tokens=300"))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == 512 + 1024 + 300


def test_auto_budget_follows_a_longer_rollout_response_length(model_folder: Path) -> None:
    overrides = (*lengths(512, 1024), "actor_rollout_ref.rollout.response_length=2048")
    mrtpo = validate_run_config(run(model_folder, *overrides))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == 512 + 2048 + 1024


def test_auto_budget_is_capped_at_the_models_maximum_position(model_folder: Path) -> None:
    mrtpo = validate_run_config(run(model_folder, *lengths(4096, 3584)))  # 7680 + 1024 > 8192
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == SMOLLM2_MAX_POSITIONS


def test_verl_lengths_beyond_the_model_are_one_line_naming_both(model_folder: Path) -> None:
    with pytest.raises(MRTPOConfigError) as error:
        validate_run_config(run(model_folder, *lengths(4096, 8192)))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("data.max_response_length: data.max_prompt_length + data.max_response_length")
    assert "12288" in message and "8192" in message and str(model_folder) in message


def test_explicit_budget_below_verls_lengths_is_refused(model_folder: Path) -> None:
    with pytest.raises(MRTPOConfigError) as error:
        validate_run_config(run(model_folder, *lengths(512, 1024), "mrtpo.replay.max_context_tokens=1200"))
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("mrtpo.replay.max_context_tokens: 1200 is below")
    assert "1536" in message and "null for auto" in message


def test_explicit_budget_beyond_the_model_is_refused(model_folder: Path) -> None:
    with pytest.raises(MRTPOConfigError, match=r"^mrtpo\.replay\.max_context_tokens: 9000 exceeds .* 8192"):
        validate_run_config(run(model_folder, *lengths(512, 1024), "mrtpo.replay.max_context_tokens=9000"))


def test_explicit_budget_in_range_is_kept(model_folder: Path) -> None:
    mrtpo = validate_run_config(run(model_folder, *lengths(512, 1024), "mrtpo.replay.max_context_tokens=1536"))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == 1536


def test_rope_scaling_override_stretches_the_maximum_position(model_folder: Path) -> None:
    yarn = "+actor_rollout_ref.model.override_config.rope_scaling={rope_type:yarn,factor:4.0}"
    explicit = "mrtpo.replay.max_context_tokens=20000"
    mrtpo = validate_run_config(run(model_folder, *lengths(512, 1024), yarn, explicit))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == 20000
    llama3 = "+actor_rollout_ref.model.override_config.rope_scaling={rope_type:llama3,factor:8.0}"
    with pytest.raises(MRTPOConfigError, match="exceeds the model's maximum position 8192"):
        validate_run_config(run(model_folder, *lengths(512, 1024), llama3, explicit))


def test_a_gguf_file_is_read_and_an_unreadable_path_skips_only_the_model_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert model_max_positions(run(GGUF_PATH)) == SMOLLM2_MAX_POSITIONS
    missing = tmp_path / "no_model_here"
    with caplog.at_level(logging.WARNING, logger="mrtpo_verl.startup.lengths"):
        mrtpo = validate_run_config(run(missing, *lengths(512, 1024), "mrtpo.replay.max_context_tokens=100000"))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens == 100000
    assert "cannot read the model config" in caplog.text and str(missing) in caplog.text
    with pytest.raises(MRTPOConfigError, match="is below"):  # verl's lengths are still checked
        validate_run_config(run(missing, *lengths(512, 1024), "mrtpo.replay.max_context_tokens=1000"))


def test_chat_template_kwargs_follow_verls_data_setting(model_folder: Path) -> None:
    mrtpo = validate_run_config(run(model_folder, "+data.apply_chat_template_kwargs.enable_thinking=false"))
    assert mrtpo is not None and mrtpo.replay.chat_template_kwargs == {"enable_thinking": False}
    mrtpo = validate_run_config(run(model_folder))
    assert mrtpo is not None and mrtpo.replay.chat_template_kwargs == {}


def test_gdpo_has_no_replay_to_resolve(model_folder: Path) -> None:
    mrtpo = validate_run_config(run(model_folder, "algorithm.adv_estimator=gdpo"))
    assert mrtpo is not None and mrtpo.replay.max_context_tokens is None

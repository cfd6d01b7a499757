"""Start-up resolution of the replay's token budget and chat-template options from verl's own settings.

The replay feeds ``prompt + verifier block + response`` to the model, so its budget follows verl's lengths:

    auto budget = data.max_prompt_length + data.max_response_length + mrtpo.replay.verifier_block_tokens

capped at the model's maximum position, read from its ``config.json`` (no weights loaded). The rollout's own
``actor_rollout_ref.rollout.prompt_length`` / ``response_length`` count when larger (they default to the data
lengths). An explicit ``mrtpo.replay.max_context_tokens`` below verl's prompt + response lengths (a response at
``data.max_response_length`` could never be replayed) or above the model's maximum position (positions the model
never learnt) is refused with one line naming the field, the value and the fix.

The model's maximum position is ``max_position_embeddings`` (or ``n_positions`` / ``max_sequence_length`` /
``seq_length``) of its text config, after ``actor_rollout_ref.model.override_config``, times the RoPE scaling
``factor`` for scaling types that stretch the trained positions (yarn, dynamic, linear: the model card keeps
``max_position_embeddings`` at the trained length); ``llama3`` / ``longrope`` configs already state the
stretched length. A local folder or a single ``.gguf`` file is read; a config that cannot be read here (a
remote path not in the cache, an unknown architecture) skips that one check with a warning.

``mrtpo.replay.chat_template_kwargs: null`` becomes ``data.apply_chat_template_kwargs``: the replay renders its
probe conversation the way the rollout rendered the prompts.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError
from mrtpo_verl.startup.reads import RunReads

__all__ = ["model_max_positions", "resolve_replay_settings"]

logger = logging.getLogger(__name__)

_POSITION_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
#: RoPE scaling types whose config states the stretched length itself (no factor applied on top).
_SCALING_TYPES_WITH_STATED_LENGTH = ("default", "llama3", "longrope", "su")


def resolve_replay_settings(
    config: DictConfig, mrtpo: MRTPOConfig, reads: RunReads | None = None, read_model: bool = True
) -> MRTPOConfig:
    """``mrtpo`` with ``replay.max_context_tokens`` and ``replay.chat_template_kwargs`` resolved and checked.

    Args:
        config: the whole run config (verl's fields and the ``mrtpo`` block).
        mrtpo: the validated ``mrtpo`` block.
        reads: the check's reads (the model config is read through it); a fresh one when None.
        read_model: False skips the model's maximum position for a budget that is already set (a budget the
            command line resolved and handed on); a null budget always reads it.

    Raises:
        MRTPOConfigError: an explicit budget that verl's lengths or the model's maximum position rule out, or
            verl lengths that exceed the model's maximum position.
    """
    replay = mrtpo.replay
    prompt_length, response_length = _verl_lengths(config)
    verl_total = prompt_length + response_length
    model_path = OmegaConf.select(config, "actor_rollout_ref.model.path")
    budget = replay.max_context_tokens
    max_positions = model_max_positions(config, reads) if read_model or budget is None else None
    lengths = f"data.max_prompt_length + data.max_response_length = {prompt_length} + {response_length}"
    if budget is None:
        if max_positions is not None and verl_total > max_positions:
            raise MRTPOConfigError(
                f"data.max_response_length: {lengths} = {verl_total} exceeds the model's maximum position "
                f"{max_positions} ({model_path}) (allowed: prompt + response ≤ {max_positions}); lower "
                "data.max_prompt_length / data.max_response_length"
            )
        budget = verl_total + replay.verifier_block_tokens
        if max_positions is not None and budget > max_positions:
            logger.info(
                "mrtpo.replay.max_context_tokens: auto budget %d capped at the model's maximum position %d",
                budget,
                max_positions,
            )
            budget = max_positions
    else:
        if budget < verl_total:
            raise MRTPOConfigError(
                f"mrtpo.replay.max_context_tokens: {budget} is below {lengths} = {verl_total} (allowed: null for "
                f"auto, or ≥ {verl_total} plus room for the verifier block); a response at data.max_response_length "
                "could not be replayed"
            )
        if max_positions is not None and budget > max_positions:
            raise MRTPOConfigError(
                f"mrtpo.replay.max_context_tokens: {budget} exceeds the model's maximum position {max_positions} "
                f"({model_path}) (allowed: null for auto, or ≤ {max_positions})"
            )
    kwargs = replay.chat_template_kwargs
    if kwargs is None:
        field = "data.apply_chat_template_kwargs"
        kwargs = _plain_dict(OmegaConf.select(config, field, default=None), field)
    resolved = dataclasses.replace(replay, max_context_tokens=budget, chat_template_kwargs=kwargs)
    return dataclasses.replace(mrtpo, replay=resolved)


def _verl_lengths(config: DictConfig) -> tuple[int, int]:
    """(prompt, response) token lengths verl's rollout can produce: the larger of the data and rollout settings."""
    lengths = []
    pairs = (("max_prompt_length", "prompt_length"), ("max_response_length", "response_length"))
    for data_field, rollout_field in pairs:
        fields = (f"data.{data_field}", f"actor_rollout_ref.rollout.{rollout_field}")
        named = [(field, OmegaConf.select(config, field, default=None)) for field in fields]
        present = [value for _, value in named if value is not None]
        for field, value in named:
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise MRTPOConfigError(f"{field}: got {value!r} (allowed: an integer ≥ 1)")
        if not present:
            raise MRTPOConfigError(
                f"data.{data_field}: not set (allowed: an integer ≥ 1); the replay's token budget follows it"
            )
        lengths.append(max(present))
    return lengths[0], lengths[1]


def model_max_positions(config: DictConfig, reads: RunReads | None = None) -> int | None:
    """The actor model's maximum position from its config (no weights); None when it cannot be read here."""
    path = OmegaConf.select(config, "actor_rollout_ref.model.path")
    if not path:
        return None
    trust_remote_code = bool(OmegaConf.select(config, "actor_rollout_ref.model.trust_remote_code", default=False))
    field = "actor_rollout_ref.model.override_config"
    override = _plain_dict(OmegaConf.select(config, field, default=None), field)
    try:
        model_config = (reads or RunReads()).model_config(str(path), trust_remote_code)
    except Exception as error:  # a remote or missing path, an unknown architecture: not ours to judge here
        logger.warning(
            "mrtpo: cannot read the model config of %s (%s: %s); the replay budget is not checked against the "
            "model's maximum position",
            path,
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
        )
        return None
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    values = {name: getattr(text_config, name, None) for name in (*_POSITION_ATTRIBUTES, "rope_scaling")}
    values.update({key: value for key, value in override.items() if key in values})
    positions = next((values[name] for name in _POSITION_ATTRIBUTES if isinstance(values[name], int)), None)
    if positions is None:
        return None
    return int(positions * _rope_stretch(values["rope_scaling"]))


def _rope_stretch(rope_scaling: Any) -> float:
    """Factor by which a RoPE scaling config stretches ``max_position_embeddings`` (1 when it states it)."""
    if not isinstance(rope_scaling, dict):
        return 1.0
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    factor = rope_scaling.get("factor")
    if kind in _SCALING_TYPES_WITH_STATED_LENGTH or not isinstance(factor, int | float) or factor <= 1:
        return 1.0
    return float(factor)


def _plain_dict(value: Any, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    if not isinstance(plain, dict):
        raise MRTPOConfigError(f"{field}: got {plain!r} (allowed: a mapping)")
    return dict(plain)

"""Start-up checks of a run, before Ray or any model starts; one entry, :func:`check_run`.

Who calls it, in which process:

- **the command line's process** (``python -m mrtpo_verl.main_ppo``): ``check_run(config, defaults=...)``, the
  full check — ``mrtpo.dry_run`` a boolean, the estimator verl knows, the ``mrtpo`` block and its fit with verl's
  settings, the replay's token budget against verl's lengths and the model's maximum position, the type of every
  verl scalar, verl's own ``validate_config``, the installed torch against the tested versions (one warning line);
  in a dry run also the run's inputs (data files, model, tokenizer, reward function). It then writes the resolved
  ``mrtpo.replay.max_context_tokens`` and ``mrtpo.replay.chat_template_kwargs`` into the config it hands to verl.
- **verl's trainer actor** (the ``TaskRunner`` Ray actor, where :class:`mrtpo_verl.trainer.advantage_step.MRTPOStep`
  attaches the MRTPO step): ``check_run(config, process="trainer")``, once, when the trainer is built — the
  ``mrtpo`` block parsed into :class:`~mrtpo_verl.config.MRTPOConfig` and its fit with verl's settings checked
  from the config alone, keeping the budget the command line resolved and handed on. It reads no file, except
  where the budget arrives unresolved (a run started through verl's own ``main``, not ours): then it reads the
  model config once, to resolve it. The block must be parsed there because the config reaches that actor through
  Ray, not as the command line's Python objects; everything else is checked once, in the command line's process.

Within one call, what the checks read is read once and handed on (:class:`~mrtpo_verl.startup.reads.RunReads`):
the model's ``config.json`` (for the budget and, in a dry run, for the model check), verl's prompt and response
lengths (read once for the budget), each data file (its parquet metadata and the rows checked).

A mistake raises :class:`~mrtpo_verl.config.MRTPOConfigError` or
:class:`~mrtpo_verl.startup.mistakes.ConfigMistake` phrased as one line; :mod:`mrtpo_verl.main_ppo` prints it
(:func:`~mrtpo_verl.startup.mistakes.one_line`) and exits with status 2.

Modules: :mod:`.run_config` (the ``mrtpo`` block and its fit with verl), :mod:`.lengths` (the replay's budget),
:mod:`.engine` (the actor engine for the colocated replay), :mod:`.verl_config` (verl's part: value types,
estimator, ``validate_config``), :mod:`.inputs` (the dry run's data, model, tokenizer and reward function),
:mod:`.compute_dtype` (the replay's precision mode against the model's architecture), :mod:`.reads` (what is read
once), :mod:`.torch_version`, :mod:`.mistakes` (the one-line error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from omegaconf import DictConfig, OmegaConf, open_dict

from mrtpo_verl.config import MRTPOConfig
from mrtpo_verl.startup.mistakes import ConfigMistake
from mrtpo_verl.startup.reads import RunReads
from mrtpo_verl.startup.run_config import (
    MULTI_REWARD_ESTIMATORS,
    OUR_TRAINER_MODE,
    REWARD_DISPATCH_PATH,
    TRAINER_MODES,
    known_reward_keys,
    validate_run_config,
)

__all__ = [
    "MULTI_REWARD_ESTIMATORS",
    "OUR_TRAINER_MODE",
    "REWARD_DISPATCH_PATH",
    "TRAINER_MODES",
    "ConfigMistake",
    "StartupReport",
    "check_run",
    "known_reward_keys",
    "validate_run_config",
]

#: The budget fields the command line resolves and hands on to the trainer actor.
HANDED_ON = ("max_context_tokens", "chat_template_kwargs")


@dataclass(frozen=True)
class StartupReport:
    """What :func:`check_run` found.

    Attributes:
        mrtpo: the validated ``mrtpo`` block with the replay's budget resolved; None for estimators other than
            ``mrtpo`` / ``gdpo``.
        dry_run: ``mrtpo.dry_run``.
        inputs_checked: whether data files, model, tokenizer and reward function were checked (dry run).
        model_config_reads: model configs read by this call (0 or 1 for a run's one actor model).
    """

    mrtpo: MRTPOConfig | None
    dry_run: bool
    inputs_checked: bool
    model_config_reads: int


def check_run(
    config: DictConfig, *, process: Literal["cli", "trainer"] = "cli", defaults: DictConfig | None = None
) -> StartupReport:
    """Check a composed run config in the given process (see the module docstring for what each one checks).

    Args:
        config: the composed run config (verl's fields and the ``mrtpo`` block). In the command line's process the
            resolved replay budget is written into it.
        process: ``cli`` — the full check; ``trainer`` — verl's trainer actor: the block only.
        defaults: the same config composed without the command line's overrides (for the type of each verl
            scalar); None skips that check.

    Raises:
        MRTPOConfigError, ConfigMistake: the first mistake, phrased as one line.
    """
    reads = RunReads()
    if process == "trainer":
        budget = OmegaConf.select(config, "mrtpo.replay.max_context_tokens", default=None)
        mrtpo = validate_run_config(config, reads, read_model=budget is None)
        return StartupReport(mrtpo, False, False, reads.model_config_reads)
    if process != "cli":
        raise ValueError(f"check_run: process={process!r} (allowed: cli | trainer)")
    from mrtpo_verl.startup.torch_version import warn_untested_torch
    from mrtpo_verl.startup.verl_config import check_estimator, check_value_types, check_verl_config

    dry = OmegaConf.select(config, "mrtpo.dry_run", default=False)
    if not isinstance(dry, bool):
        raise ConfigMistake(f"mrtpo.dry_run: got {dry!r} (allowed: true | false)")
    check_estimator(config)
    mrtpo = validate_run_config(config, reads)
    if mrtpo is not None and str(OmegaConf.select(config, "algorithm.adv_estimator")) == "mrtpo":
        from mrtpo_verl.startup.compute_dtype import check_compute_dtype

        check_compute_dtype(config, mrtpo, reads)
    if defaults is not None:
        check_value_types(config, defaults)
    check_verl_config(config)
    if dry:
        from mrtpo_verl.startup.inputs import check_run_inputs

        check_run_inputs(config, reads)
    warn_untested_torch()
    if mrtpo is not None:
        _hand_on(config, mrtpo)
    return StartupReport(mrtpo, dry, dry, reads.model_config_reads)


def _hand_on(config: DictConfig, mrtpo: MRTPOConfig) -> None:
    """The resolved replay budget written into the config verl carries to the trainer actor."""
    replay = OmegaConf.select(config, "mrtpo.replay", default=None)
    if not isinstance(replay, DictConfig):
        return
    with open_dict(replay):
        for name in HANDED_ON:
            setattr(replay, name, getattr(mrtpo.replay, name))

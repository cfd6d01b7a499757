"""``python -m mrtpo_verl.main_ppo``: verl's PPO entry point on the MRTPO config.

Composes ``mrtpo_verl/configs/mrtpo_trainer.yaml`` (verl's ``ppo_trainer`` plus the ``mrtpo``
block), checks it before anything starts — the ``mrtpo`` block, the type of every verl scalar,
verl's own ``validate_config`` — then hands the config to verl's own hydra ``main`` (hydra passes
a given config straight through), which starts Ray and the trainer registered as
``trainer.v1.trainer_mode``. With ``mrtpo.dry_run=true`` (any estimator) it also checks what the
run would read (data files and their columns, model, tokenizer, reward function; see
:mod:`mrtpo_verl.startup.inputs`), prints the resolved config and exits without starting Ray.

A mistake in the command line or the config ends the process with one line on stderr,
``error: <field>: <value and problem>; <fix>``, and exit status 2; ``MRTPO_TRACEBACK=1`` (or
hydra's ``HYDRA_FULL_ERROR=1``) prints the traceback above that line. Errors once training has
started are reported as verl reports them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import hydra
from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.startup import check_run
from mrtpo_verl.startup.mistakes import EXIT_CODE, one_line, report, wants_traceback

#: What the command line's run found: the mistake (with the error it came from) or None; set by ``main``.
_outcome: dict[str, BaseException | None] = {"mistake": None}


def dry_run(config: DictConfig) -> None:
    """Print the resolved config (stdout: the yaml, then one closing line)."""
    print(OmegaConf.to_yaml(config, resolve=True))
    print(f"mrtpo: config valid (adv_estimator={config.algorithm.adv_estimator}); dry run, nothing started")


def check_config(config: DictConfig) -> None:
    """Every start-up check that needs neither Ray nor a model (:func:`mrtpo_verl.startup.check_run`, this
    process's one call); the dry run adds the run's inputs."""
    check_run(config, defaults=_defaults())


def _defaults() -> DictConfig:
    """The same primary config without the command line's overrides (for the type of each default)."""
    from hydra.core.hydra_config import HydraConfig

    return hydra.compose(config_name=HydraConfig.get().job.config_name, overrides=[])


@hydra.main(config_path="configs", config_name="mrtpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    _restore_hydra_full_error()
    try:
        check_config(config)
    except Exception as error:  # before Ray starts, every error is a mistake in config or inputs
        _outcome["mistake"] = error  # reported by cli() once hydra returns, without hydra's override dump
        return
    if OmegaConf.select(config, "mrtpo.dry_run", default=False) is True:
        dry_run(config)
        return
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)


#: The caller's HYDRA_FULL_ERROR (None: unset), put back once composition is over.
_caller_hydra_full_error: dict[str, str | None] = {}


def _restore_hydra_full_error() -> None:
    if "value" not in _caller_hydra_full_error:
        return
    value = _caller_hydra_full_error.pop("value")
    if value is None:
        os.environ.pop("HYDRA_FULL_ERROR", None)
    else:
        os.environ["HYDRA_FULL_ERROR"] = value


def cli(argv: Sequence[str] | None = None) -> int:
    """Run :func:`main` on the command line; a config mistake → one ``error:`` line and :data:`EXIT_CODE`.

    hydra re-raises composition errors (a typo'd key, an unparsable override) only with
    ``HYDRA_FULL_ERROR=1``, so it is set while hydra composes and put back before the run starts.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = wants_traceback()
    _caller_hydra_full_error["value"] = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    _outcome["mistake"] = None
    try:
        main()
    except Exception as error:
        if "value" not in _caller_hydra_full_error:
            raise  # raised by the run itself, after start-up: not a config mistake
        _restore_hydra_full_error()
        report(error, one_line(error, argv, _keys_at), show_traceback)
        return EXIT_CODE
    finally:
        _restore_hydra_full_error()
    mistake = _outcome["mistake"]
    if mistake is not None:
        report(mistake, one_line(mistake, argv, _keys_at), show_traceback)
        return EXIT_CODE
    return 0


def _keys_at(path: str) -> list[str] | None:
    """Keys of the default config at ``path`` (None if it is not a mapping), for "did you mean"."""
    try:
        from hydra import compose, initialize_config_module
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        with initialize_config_module(config_module="mrtpo_verl.configs", version_base=None):
            base = compose(config_name="mrtpo_trainer")
    except Exception:  # a suggestion is optional; the error line stands without it
        return None
    node = OmegaConf.select(base, path, default=None) if path else base
    return [str(key) for key in node] if isinstance(node, DictConfig) else None


if __name__ == "__main__":
    sys.exit(cli())

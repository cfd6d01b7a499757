"""``python -m mrtpo_verl.main_ppo``: verl's PPO entry point on the MRTPO config.

Composes ``mrtpo_verl/configs/mrtpo_trainer.yaml`` (verl's ``ppo_trainer`` plus the ``mrtpo``
block), validates the ``mrtpo`` block before anything starts, then hands the config to verl's own
hydra ``main`` (hydra passes a given config straight through), which starts Ray and the trainer
registered as ``trainer.v1.trainer_mode``. With ``mrtpo.dry_run=true`` (any estimator) it also runs
verl's own ``validate_config``, prints the resolved config and exits without starting Ray.
"""

from __future__ import annotations

import contextlib
import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.startup import validate_run_config


def dry_run(config: DictConfig) -> None:
    """verl's own start-up checks (as its ``main`` runs them), then print the resolved config."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    # verl reports its checks on stdout; keep stdout for the config alone, so it parses as yaml.
    with contextlib.redirect_stdout(sys.stderr):
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )
    print(OmegaConf.to_yaml(config, resolve=True))
    print(f"mrtpo: config valid (adv_estimator={config.algorithm.adv_estimator}); dry run, nothing started")


@hydra.main(config_path="configs", config_name="mrtpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    validate_run_config(config)
    if OmegaConf.select(config, "mrtpo.dry_run", default=False):
        dry_run(config)
        return
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)


if __name__ == "__main__":
    main()

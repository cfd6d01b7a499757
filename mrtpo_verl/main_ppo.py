"""``python -m mrtpo_verl.main_ppo``: verl's PPO entry point on the MRTPO config.

Composes ``mrtpo_verl/configs/mrtpo_trainer.yaml`` (verl's ``ppo_trainer`` plus the ``mrtpo``
block), validates the ``mrtpo`` block before anything starts, then hands the config to verl's own
hydra ``main`` (hydra passes a given config straight through), which starts Ray and the trainer
registered as ``trainer.v1.trainer_mode``. With ``mrtpo.dry_run=true`` it prints the resolved
config and exits instead.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.startup import validate_run_config


@hydra.main(config_path="configs", config_name="mrtpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    mrtpo = validate_run_config(config)
    if mrtpo is not None and mrtpo.dry_run:
        print(OmegaConf.to_yaml(config, resolve=True))
        print(f"mrtpo: config valid (adv_estimator={config.algorithm.adv_estimator}); dry run, nothing started")
        return
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)


if __name__ == "__main__":
    main()

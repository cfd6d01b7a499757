"""Where verl 0.9.1 keeps the two registries the plugin writes into, by module name only.

Importing this module imports nothing of verl: the plugin (:mod:`mrtpo_verl.plugin`) waits for these
modules instead of importing them, so a process that never looks up an estimator or a trainer does
not pay for verl's trainer stack.

====================================  ==============================================================
module                                registry (and the look-up that reads it, in the same module)
====================================  ==============================================================
``verl.trainer.ppo.core_algos``       ``register_adv_est`` → ``ADV_ESTIMATOR_REGISTRY`` (``get_adv_estimator_fn``)
``verl.trainer.ppo.v1.trainer_base``  ``register_trainer`` → ``TRAINER_REGISTRY`` (``get_trainer_cls``)
====================================  ==============================================================

Because each look-up lives in the module that holds its registry, a registration made the moment the
module finishes importing precedes every look-up. ``tests/test_compat_contract_on_cpu.py`` fails when either
registry or its look-up leaves its module.
"""

from __future__ import annotations

__all__ = ["ESTIMATOR_REGISTRY_MODULE", "TRAINER_REGISTRY_MODULE"]

ESTIMATOR_REGISTRY_MODULE = "verl.trainer.ppo.core_algos"
"""Module that defines ``register_adv_est`` and ``get_adv_estimator_fn`` (verl 0.9.1)."""

TRAINER_REGISTRY_MODULE = "verl.trainer.ppo.v1.trainer_base"
"""Module that defines ``register_trainer`` and ``get_trainer_cls`` for the v1 trainers (verl 0.9.1)."""

"""Where verl 0.9.1 keeps the registries we write into, by module name, and the two registry accesses it has no API for.

Importing this module imports nothing of verl: the plugin (:mod:`mrtpo_verl.plugin`) and the CPU backend
(:mod:`mrtpo_cpu.register`) wait for these modules instead of importing them (post-import hooks), so a process
that never looks something up in a registry does not pay for importing it.

=======================================  ============================================================================
module                                   registry (and the look-up that reads it, reached only through this module)
=======================================  ============================================================================
``verl.trainer.ppo.core_algos``          ``register_adv_est`` → ``ADV_ESTIMATOR_REGISTRY`` (``get_adv_estimator_fn``)
``verl.trainer.ppo.v1.trainer_base``     ``register_trainer`` → ``TRAINER_REGISTRY`` (``get_trainer_cls``)
``verl.workers.engine``                  ``EngineRegistry`` (``get_engine_cls``), with verl's FSDP engine classes
``verl.checkpoint_engine``               ``CheckpointEngineRegistry`` (``get``, ``new``)
``verl.workers.rollout.replica``         ``RolloutReplicaRegistry`` (``get``)
``verl.workers.rollout.base``            ``_ROLLOUT_REGISTRY`` (``get_rollout_class``)
=======================================  ============================================================================

Each look-up is defined in its module, so a registration made the moment the module finishes importing precedes
every look-up. For the two packages, registry and look-up live in the package's ``base`` submodule, which the
package's ``__init__`` imports: importing ``base`` from anywhere runs that ``__init__`` to its end first, and the
hook fires there. ``tests/test_compat_contract_on_cpu.py`` fails when a registry or its look-up leaves its module.

Only the first two are the product's (the ``mrtpo`` estimator and the ``mrtpo_<mode>`` trainers); the other four
are where the CPU backend registers verl's FSDP engine for ``cpu``, the ``hf`` rollout and the ``gloo``
checkpoint engine.
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINT_ENGINE_REGISTRY_MODULE",
    "ENGINE_REGISTRY_MODULE",
    "ESTIMATOR_REGISTRY_MODULE",
    "ROLLOUT_ADAPTER_REGISTRY_MODULE",
    "ROLLOUT_REPLICA_REGISTRY_MODULE",
    "TRAINER_REGISTRY_MODULE",
    "engine_registered",
    "register_rollout_adapter",
]

ESTIMATOR_REGISTRY_MODULE = "verl.trainer.ppo.core_algos"
"""Module that defines ``register_adv_est`` and ``get_adv_estimator_fn`` (verl 0.9.1)."""

TRAINER_REGISTRY_MODULE = "verl.trainer.ppo.v1.trainer_base"
"""Module that defines ``register_trainer`` and ``get_trainer_cls`` for the v1 trainers (verl 0.9.1)."""

ENGINE_REGISTRY_MODULE = "verl.workers.engine"
"""Package whose ``__init__`` imports ``EngineRegistry`` (from ``.base``) and the FSDP engine classes (verl 0.9.1)."""

CHECKPOINT_ENGINE_REGISTRY_MODULE = "verl.checkpoint_engine"
"""Package whose ``__init__`` imports ``CheckpointEngineRegistry`` (from ``.base``) (verl 0.9.1)."""

ROLLOUT_REPLICA_REGISTRY_MODULE = "verl.workers.rollout.replica"
"""Module that defines ``RolloutReplicaRegistry`` (``register``, ``get``) (verl 0.9.1)."""

ROLLOUT_ADAPTER_REGISTRY_MODULE = "verl.workers.rollout.base"
"""Module that defines ``_ROLLOUT_REGISTRY`` and ``get_rollout_class`` (verl 0.9.1)."""


def engine_registered(model_type: str, backend: str, device: str) -> bool:
    """Whether verl's ``EngineRegistry`` holds an engine for (model type, backend, device).

    Relies on: verl 0.9.1's ``EngineRegistry._engines[model_type][backend][device]``.
    """
    from verl.workers.engine import EngineRegistry

    return device in EngineRegistry._engines.get(model_type, {}).get(backend, {})


def register_rollout_adapter(name: str, mode: str, dotted_class: str) -> None:
    """Map rollout ``name`` in ``mode`` to a server-adapter class (``package.module.Class``).

    Relies on: verl 0.9.1's ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` ((name, mode) → dotted path), which
    has no register function.
    """
    from verl.workers.rollout import base as rollout_base

    rollout_base._ROLLOUT_REGISTRY[(name, mode)] = dotted_class

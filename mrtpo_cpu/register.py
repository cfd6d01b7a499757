"""Registers the CPU backend with verl; the module ``VERL_USE_EXTERNAL_MODULES`` names.

``import verl`` imports it (``verl/__init__.py``: ``import_external_libs``) in every process of a CPU run,
before any code asks for the platform, so the CPU platform is in ``PlatformRegistry`` when verl first
resolves one. With ``VERL_PLATFORM=cpu`` it also registers verl's FSDP engine for ``cpu``, the ``hf`` rollout
and the ``gloo`` checkpoint engine (``separate_async``'s weight push to its standalone pool), each when verl's
registry module for it finishes importing (``wrapt.register_post_import_hook``; the module names are in
:mod:`mrtpo_verl.compat.verl_registries`), as the plugin registers the estimator and trainers: importing them
here would import verl's FSDP engine and checkpoint-engine stack into every process of the run, also the
TransferQueue, reward and rollout-server processes that never look one up (the cost: docs/performance.md).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import wrapt

from mrtpo_cpu.platform import PLATFORM_NAME, PlatformCPU
from mrtpo_verl.compat.verl_registries import (
    CHECKPOINT_ENGINE_REGISTRY_MODULE,
    ENGINE_REGISTRY_MODULE,
    ROLLOUT_ADAPTER_REGISTRY_MODULE,
    ROLLOUT_REPLICA_REGISTRY_MODULE,
    register_rollout_adapter,
)

__all__ = [
    "PLATFORM_NAME",
    "ROLLOUT_NAME",
    "PlatformCPU",
    "install",
    "register_cpu_engine",
    "register_gloo_checkpoint_engine",
    "register_hf_adapter",
    "register_hf_replica",
]

#: ``actor_rollout_ref.rollout.name`` of the HF rollout (:mod:`mrtpo_cpu.rollout`).
ROLLOUT_NAME = "hf"
_ROLLOUT_MODULE = "mrtpo_cpu.rollout"


def register_cpu_engine(_registry_module: ModuleType | None = None) -> None:
    """verl's FSDP engines for device ``cpu`` in ``EngineRegistry`` (:mod:`mrtpo_cpu.engine`)."""
    from mrtpo_cpu.engine import register_cpu_engines

    register_cpu_engines()


def register_gloo_checkpoint_engine(_registry_module: ModuleType | None = None) -> None:
    """``gloo`` in ``CheckpointEngineRegistry``: importing :mod:`mrtpo_cpu.gloo_checkpoint_engine` registers it."""
    importlib.import_module("mrtpo_cpu.gloo_checkpoint_engine")


def register_hf_replica(_registry_module: ModuleType | None = None) -> None:
    """``hf`` in verl's ``RolloutReplicaRegistry`` (its public API), loading :mod:`mrtpo_cpu.rollout` on first use."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: importlib.import_module(_ROLLOUT_MODULE).HFReplica)


def register_hf_adapter(_registry_module: ModuleType | None = None) -> None:
    """``hf`` in verl's server-adapter registry, through the seam (verl has no API for it)."""
    register_rollout_adapter(ROLLOUT_NAME, "async", f"{_ROLLOUT_MODULE}.HFServerAdapter")


#: Each registration and the verl module whose import triggers it.
_REGISTRATIONS = (
    (register_cpu_engine, ENGINE_REGISTRY_MODULE),
    (register_gloo_checkpoint_engine, CHECKPOINT_ENGINE_REGISTRY_MODULE),
    (register_hf_replica, ROLLOUT_REPLICA_REGISTRY_MODULE),
    (register_hf_adapter, ROLLOUT_ADAPTER_REGISTRY_MODULE),
)


def install() -> None:
    """Register the CPU engine, the ``hf`` rollout and the ``gloo`` checkpoint engine with verl (idempotent).

    Each runs when its registry module finishes importing, at once if it already has; a failure raises from
    that import (a run that needs the backend stops there, naming it).
    """
    for register, module in _REGISTRATIONS:
        wrapt.register_post_import_hook(register, module)


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
    install()

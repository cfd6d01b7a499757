"""Registers the CPU backend with verl; the module ``VERL_USE_EXTERNAL_MODULES`` names.

``import verl`` imports it (``verl/__init__.py``: ``import_external_libs``) before any code asks
for the platform, so the CPU platform is in ``PlatformRegistry`` when verl first resolves one.
With ``VERL_PLATFORM=cpu`` it also registers verl's FSDP engine for ``cpu``, the ``hf``
rollout and the ``gloo`` checkpoint engine (``separate_async``'s weight push to its standalone pool).
"""

from __future__ import annotations

import os

from mrtpo_cpu.platform import PLATFORM_NAME, PlatformCPU

__all__ = ["PLATFORM_NAME", "ROLLOUT_NAME", "PlatformCPU", "install", "register_hf_rollout"]

#: ``actor_rollout_ref.rollout.name`` of the HF rollout (:mod:`mrtpo_cpu.rollout`).
ROLLOUT_NAME = "hf"
_ROLLOUT_MODULE = "mrtpo_cpu.rollout"


def register_hf_rollout() -> None:
    """Register ``hf`` in both of verl's rollout registries, lazily (the module loads on first use).

    ``RolloutReplicaRegistry.register(name, loader)`` is verl's API for replicas; the server adapter goes
    through :func:`mrtpo_verl.compat.verl.register_rollout_adapter` (verl has no API for it).
    """
    import importlib

    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from mrtpo_verl.compat.verl import register_rollout_adapter

    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: importlib.import_module(_ROLLOUT_MODULE).HFReplica)
    register_rollout_adapter(ROLLOUT_NAME, "async", f"{_ROLLOUT_MODULE}.HFServerAdapter")


def install() -> None:
    """Register the CPU engine, the ``hf`` rollout and the ``gloo`` checkpoint engine with verl (idempotent)."""
    from mrtpo_cpu import gloo_checkpoint_engine  # noqa: F401  (CheckpointEngineRegistry: "gloo")
    from mrtpo_cpu.engine import register_cpu_engines

    register_cpu_engines()
    register_hf_rollout()


if os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME:
    install()

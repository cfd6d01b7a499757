"""CPU backend for verl 0.9.1 (test support / optional): platform, training engine and rollout on CPU.

Everything here goes through verl's own extension points; no verl file is edited and no verl
loop is copied:

- platform: :class:`~mrtpo_verl.cpu_support.platform.PlatformCPU` in verl's
  ``PlatformRegistry`` under ``cpu``, selected with ``VERL_PLATFORM=cpu``;
- training engine: verl's own ``FSDPEngineWithLMHead`` (FSDP2 on gloo) registered in verl's
  ``EngineRegistry`` for device ``cpu`` as well (verl registers it for cuda/npu only);
- rollout: an HF-transformers server (:mod:`mrtpo_verl.cpu_support.rollout`) in verl's
  ``RolloutReplicaRegistry`` and rollout-adapter registry under ``hf``.

Importing :mod:`mrtpo_verl.cpu_support.register` (every process does, through
``VERL_USE_EXTERNAL_MODULES``, which ``import verl`` honours) registers the platform; when the
process's platform is ``cpu`` it also registers the engine and the rollout. This package's
``__init__`` imports nothing, so that its modules can be imported from inside ``import verl``.
See :mod:`mrtpo_verl.cpu_support.launch` for the environment and config a CPU run needs.
"""

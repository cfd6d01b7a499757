"""The CPU backend for verl 0.9.1: platform, training engine, rollout and checkpoint engine on CPU.

Kept apart from the product (``mrtpo_verl`` imports nothing from here, and the wheel does not ship it): it
serves this repository's CPU runs of verl's real trainer — the tests (``tests/cpu_run``, the colocated replay
and engine tests, the CLI and recipe dry runs' model folder), the learning benchmark's CPU preset on its demo
task (``benchmarks.learning``) and the CPU benchmarks. The demo (``python -m mrtpo_verl.demo``) runs MRTPO's
step without verl's trainer and needs none of it. See ``docs/cpu_backend.md``.

Everything goes through verl's own extension points; no verl file is edited and no verl loop is copied:

- platform: :class:`~mrtpo_cpu.platform.PlatformCPU` in verl's ``PlatformRegistry`` under ``cpu``, selected
  with ``VERL_PLATFORM=cpu``;
- training engine: verl's own ``FSDPEngineWithLMHead`` (FSDP2 on gloo) registered in verl's ``EngineRegistry``
  for device ``cpu`` as well (verl registers it for cuda/npu only);
- rollout: an HF-transformers server (:mod:`mrtpo_cpu.rollout`) in verl's ``RolloutReplicaRegistry`` and, through
  :func:`mrtpo_verl.compat.verl_registries.register_rollout_adapter` (verl's adapter registry is private), under ``hf``;
- checkpoint engine: ``gloo`` (:mod:`mrtpo_cpu.gloo_checkpoint_engine`) in verl's ``CheckpointEngineRegistry``.

It registers itself only when a run asks for it: :data:`mrtpo_cpu.launch.CPU_ENV` names
:mod:`mrtpo_cpu.register` in ``VERL_USE_EXTERNAL_MODULES`` (``import verl`` imports it in every process of the
run) and sets ``VERL_PLATFORM=cpu``; without them nothing here is imported. This ``__init__`` imports nothing,
so that its modules can be imported from inside ``import verl``. :mod:`mrtpo_cpu.launch` holds the environment
and config a CPU run needs.
"""

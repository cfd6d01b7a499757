"""verl's FSDP training engine on CPU: the same class, registered for device ``cpu``.

verl 0.9.1 registers ``FSDPEngineWithLMHead`` in ``EngineRegistry`` for ``cuda`` and ``npu`` only
(``verl/workers/engine/fsdp/transformer_impl.py``, the ``@EngineRegistry.register`` decorator),
and ``EngineRegistry.get_engine_cls`` picks by the platform's device name. The engine itself is
device-agnostic through verl's platform layer (device mesh, ``torch.distributed`` with the
platform's backend — gloo here), so registering the unchanged class for ``cpu`` is enough.
"""

from __future__ import annotations

__all__ = ["CPU_DEVICE", "register_cpu_engines"]

CPU_DEVICE = "cpu"


def register_cpu_engines() -> None:
    """Register verl's FSDP engines (language and value model) for ``cpu`` (idempotent)."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    from mrtpo_verl.compat.verl_registries import engine_registered

    for model_type, engine_cls in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        for backend in ("fsdp", "fsdp2"):
            if not engine_registered(model_type, backend, CPU_DEVICE):
                EngineRegistry.register(model_type=model_type, backend=backend, device=CPU_DEVICE)(engine_cls)

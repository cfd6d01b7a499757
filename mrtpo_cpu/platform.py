"""A CPU platform for verl's platform registry (``verl.plugin.platform.PlatformRegistry``).

verl 0.9.1 resolves one platform per process (``get_platform()``): ``VERL_PLATFORM`` names it,
otherwise the first registered platform whose ``is_platform_available`` is true wins, and with
none it falls back to ``nvidia``. Registering this class under ``cpu`` (and setting
``VERL_PLATFORM=cpu`` in every process) makes verl's device helpers answer ``cpu`` / ``gloo``.

Ray integration: verl's ``ResourcePoolManager`` always builds ``use_gpu=True`` pools and checks
the cluster's ``GPU``/``NPU`` count, so a CPU run starts Ray with *logical* GPUs
(``ray.init(num_gpus=N)``: Ray only counts them) and this platform names ``GPU`` as its Ray
resource. Nothing ever touches CUDA.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

__all__ = ["PLATFORM_NAME", "PlatformCPU"]

PLATFORM_NAME = "cpu"


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform backend for plain CPUs (gloo collectives, no accelerator)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _CPUDeviceModule  # type: ignore[return-value]

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Only when asked for: auto-detection must never pick CPU on a GPU host.
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME

    def current_device(self) -> str:  # type: ignore[override]
        # verl passes get_device_id() straight to .to()/device= (e.g. verl/utils/fsdp_utils.py:507);
        # an int there means an accelerator index, so the CPU answers with the device itself
        # (as torch.cpu.current_device() does).
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):  # type: ignore[no-untyped-def]
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


class _CPUDeviceModule:
    """What verl calls on ``get_torch_device()`` (``torch.cuda``'s role), answered for the CPU."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state() -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        import psutil

        memory = psutil.virtual_memory()
        return int(memory.available), int(memory.total)

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def is_bf16_supported() -> bool:
        return True

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    Stream = torch.cpu.Stream
    Event = torch.cpu.Event
    stream = staticmethod(torch.cpu.stream)
    current_stream = staticmethod(torch.cpu.current_stream)
    amp = torch.cpu.amp

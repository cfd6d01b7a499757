"""The gloo process group of a CPU worker, set up before verl asks for one.

verl 0.9.1 initialises ``torch.distributed`` in ``TrainingWorker.__init__`` through
``verl.utils.distributed.initialize_global_process_group_ray``, whose backend string is
``f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"`` (verl/utils/distributed.py:89). On a
CPU platform that is ``cpu:gloo,cpu:gloo``, which torch rejects ("Duplicate device type cpu").
verl skips its own initialisation when a process group already exists
(``if not torch.distributed.is_initialized()``, the next line), so a CPU worker creates the gloo
group itself, first thing in the process.

:func:`setup_worker_process` is a Ray ``worker_process_setup_hook`` (Ray runs it at the start of
every worker process of the job; set through verl's ``ray_kwargs.ray_init.runtime_env``). It acts
only in processes of a verl worker group — those carry the ``WG_BACKEND=ray``, ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` that ``RayWorkerGroup`` gives each worker —
and only on the CPU platform.
"""

from __future__ import annotations

import os
from datetime import timedelta

__all__ = ["SETUP_HOOK", "setup_worker_process"]

#: Value for ``ray_init.runtime_env.worker_process_setup_hook``.
SETUP_HOOK = f"{__name__}.setup_worker_process"

_WORKER_GROUP_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def setup_worker_process() -> bool:
    """Create the gloo process group of a verl worker-group process on CPU; True if it did."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return False
    if os.environ.get("WG_BACKEND") != "ray" or not all(os.environ.get(key) for key in _WORKER_GROUP_ENV):
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group(
        backend="gloo",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        init_method=os.environ.get("DIST_INIT_METHOD") or None,
        timeout=timedelta(minutes=30),
    )
    return True

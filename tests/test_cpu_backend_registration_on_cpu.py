"""The CPU backend registers into verl's registries when they are imported, and only then.

Every process of a CPU run imports :mod:`mrtpo_cpu.register` inside ``import verl``; most of them (TransferQueue
storage, reward and agent-loop workers, rollout servers) never look up an engine, so the registrations must not
import verl's engine or checkpoint-engine stack up front. Each test runs in a fresh interpreter with the run's
own environment (:data:`mrtpo_cpu.launch.CPU_ENV`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from mrtpo_cpu.launch import CPU_ENV
from mrtpo_verl.compat import verl_registries

REGISTRY_MODULES = (
    verl_registries.ENGINE_REGISTRY_MODULE,
    verl_registries.CHECKPOINT_ENGINE_REGISTRY_MODULE,
    verl_registries.ROLLOUT_REPLICA_REGISTRY_MODULE,
    verl_registries.ROLLOUT_ADAPTER_REGISTRY_MODULE,
)


def run_cpu_process(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CPU_ENV}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, env=env
    )


def test_import_verl_registers_the_platform_and_imports_no_registry_module() -> None:
    result = run_cpu_process(
        f"""
        import sys
        import verl
        from verl.plugin.platform import get_platform
        print(type(get_platform()).__name__)
        print(sorted(m for m in {REGISTRY_MODULES!r} if m in sys.modules))
        print(sorted(m for m in sys.modules if m.startswith("mrtpo_cpu")))
        """
    )
    assert result.returncode == 0, result.stderr
    platform, registries, backend = result.stdout.splitlines()[-3:]
    assert platform == "PlatformCPU"
    assert registries == "[]", f"import verl already imported: {registries}"
    assert backend == "['mrtpo_cpu', 'mrtpo_cpu.platform', 'mrtpo_cpu.register']"


def test_each_registry_finds_the_cpu_backend_once_imported() -> None:
    result = run_cpu_process(
        """
        import verl
        from verl.workers.engine import EngineRegistry
        from verl.checkpoint_engine import CheckpointEngineRegistry
        from verl.workers.rollout.replica import RolloutReplicaRegistry
        from verl.workers.rollout.base import get_rollout_class
        print(EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__)
        print(CheckpointEngineRegistry.get("gloo").__module__)
        print(RolloutReplicaRegistry.get("hf").__module__)
        print(get_rollout_class("hf", "async").__name__)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-4:] == [
        "FSDPEngineWithLMHead",
        "mrtpo_cpu.gloo_checkpoint_engine",
        "mrtpo_cpu.rollout",
        "HFServerAdapter",
    ]

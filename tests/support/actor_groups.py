"""verl's real actor worker as a two-rank FSDP2 group on gloo, for the colocated replay tests (CPU).

The only stand-in: Ray's placement groups ask for GPUs, so the clusters declare logical GPUs; every tensor lives
on the CPU. :class:`FaultyActorWorker` adds two test-only methods to the package's actor worker (nothing like them
is in the package).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import torch
from ray import cloudpickle
from verl.single_controller.base.decorator import Dispatch, register

from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.cpu_support.distributed import SETUP_HOOK
from mrtpo_verl.cpu_support.launch import CPU_ENV, compose_actor_config
from mrtpo_verl.trainer.replay_stage import build_request
from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker
from mrtpo_verl.workers.placement import ColocatedBackend
from tests.support.ray_groups import release
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS

RANKS = 2
# The colocated replay shares prefixes (the default, min_shared_tokens=1: the deepest tree, most collective calls);
# the in-process reference does not, so the checks cover sharing on verl's FSDP2 engine against the plain path.
CFG = MRTPOConfig(
    reward_keys=REWARD_KEYS,
    verifier_info_keys=INFO_KEYS,
    replay=ReplayConfig(micro_batch_size=2, share_prefix=True, min_shared_tokens=1),
)
UNSHARED = MRTPOConfig(
    reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=2, share_prefix=False)
)


@contextmanager
def cpu_ray_cluster(num_gpus: int) -> Iterator[None]:
    """A local Ray cluster with ``num_gpus`` logical GPUs (verl's resource pools place one worker per "GPU")."""
    ray.init(
        address="local",  # a cluster of its own, even if another one runs on this machine
        num_cpus=4,
        num_gpus=num_gpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": dict(CPU_ENV), "worker_process_setup_hook": SETUP_HOOK},
    )
    try:
        yield
    finally:
        ray.shutdown()


class FaultyActorWorker(MRTPOActorRolloutRefWorker):
    """Test-only: the actor worker with a hook that breaks one rank's replay (no such hook in the package).

    :meth:`poison_replay_pass` makes forward pass number ``at_pass`` (1-based, this request) of rank ``rank``
    return NaN hidden states (and NaN keys in the prefix caches it makes), once; the scorer's NaN check on the
    LM-head logits then raises on that rank after the ranks agreed on their number of passes, with the other rank
    about to enter its next pass.
    """

    _poison: tuple[int, int] | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def poison_replay_pass(self, rank: int, at_pass: int) -> None:
        self._poison = (rank, at_pass)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def engine_facts(self) -> dict[str, str]:
        """What verl's engine built: the root module's forward, LoRA or not, the autocast dtype, offload."""
        engine = self.actor.engine
        peft = hasattr(engine.module, "peft_config")
        inner = engine.module.base_model.model if peft else engine.module  # peft: PeftModel → LoraModel → causal LM
        return {
            "forward": f"{type(inner).forward.__module__}.{type(inner).forward.__name__}",
            "peft": str(peft),
            "autocast": str(getattr(engine, "_autocast_dtype", None)),
            "param_offload": str(engine.is_param_offload_enabled),
        }

    def _colocated_replay(self, mrtpo_block: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
        builder, scorer, info_keys = super()._colocated_replay(mrtpo_block)
        if self._poison is not None and self._poison[0] == self.rank:
            runner, at_pass, passes = scorer.runner, self._poison[1], [0]
            self._poison = None
            clean = type(runner).forward_pass.__get__(runner)

            def poisoned(*args: Any, **kwargs: Any) -> Any:
                hidden, layers = clean(*args, **kwargs)
                passes[0] += 1
                if passes[0] == at_pass:
                    runner.forward_pass = clean  # once
                    # NaN hidden states, and NaN keys in the caches this pass makes (for the later passes).
                    nan_layers = None if layers is None else tuple((k * float("nan"), v) for k, v in layers)
                    return torch.full_like(hidden, float("nan")), nan_layers
                return hidden, layers

            runner.forward_pass = poisoned
        return builder, scorer, info_keys


# Ray ships the class by value: its workers do not import the tests package.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@contextmanager
def started_actor_group(model_dir: Path, options: tuple[str, ...] = (), name: str = "colocated_test") -> Iterator[Any]:
    """Two ranks of verl's actor worker (FSDP2 on gloo) with the given engine options; released after."""
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool(process_on_nodes=[RANKS], use_gpu=True, max_colocate_count=1, name_prefix=name)
    worker = RayClassWithInitArgs(
        cls=ray.remote(FaultyActorWorker), config=compose_actor_config(model_dir, RANKS, options), role="actor"
    )
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
    try:
        group.init_model()
        yield group
    finally:
        release(group)  # frees the logical GPUs for the next group


def relevance_of(group: Any, data: Any, cfg: MRTPOConfig = CFG) -> torch.Tensor:
    needed = torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool)
    return ColocatedBackend(group, cfg).compute_relevance(build_request(data, cfg, needed)).batch[RELEVANCE_KEY]

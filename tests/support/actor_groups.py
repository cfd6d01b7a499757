"""verl's real actor worker as a two-rank FSDP2 group on gloo, for the colocated replay tests (CPU).

The only stand-in: Ray's placement groups ask for GPUs, so the clusters declare logical GPUs; every tensor lives
on the CPU. :class:`FaultyActorWorker` adds test-only methods to the package's actor worker (nothing like them is
in the package): a hook that breaks one rank's replay, what verl's engine built, and a record of what each replay
request went through (verl's parameter moves, the engine's mode at each decoder call).
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

from mrtpo_cpu.distributed import SETUP_HOOK
from mrtpo_cpu.launch import CPU_ENV, compose_actor_config
from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig, ReplayConfig
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
        """What verl's engine built: the root module's forward, LoRA or not, the autocast dtype, offload, and what
        each engine option leaves on the engine or the model (read from the built objects, not from the config)."""
        from transformers.integrations import flash_attention

        engine = self.actor.engine
        peft = hasattr(engine.module, "peft_config")
        inner = engine.module.base_model.model if peft else engine.module  # peft: PeftModel → LoraModel → causal LM
        lora_b = [module.lora_B for module in inner.modules() if hasattr(module, "lora_B")]
        state = engine.module._get_fsdp_state() if hasattr(engine.module, "_get_fsdp_state") else None
        flash = flash_attention._flash_attention_forward

        def local(param: torch.Tensor) -> torch.Tensor:  # FSDP2 parameters are DTensors: this rank's shard
            return param.to_local() if hasattr(param, "to_local") else param

        return {
            "forward": f"{type(inner).forward.__module__}.{type(inner).forward.__name__}",
            "peft": str(peft),
            "autocast": str(getattr(engine, "_autocast_dtype", None)),
            "param_offload": str(engine.is_param_offload_enabled),
            "optimizer_offload": str(engine.is_optimizer_offload_enabled),
            "remove_padding": str(engine.use_remove_padding),
            "flash_attention_forward": f"{flash.__module__}.{flash.__name__}",
            "gradient_checkpointing": str(inner.is_gradient_checkpointing),
            # torch.compile's wrapper keeps the function it compiles.
            "entropy_compiled": str(hasattr(engine.compute_entropy_from_logits, "_torchdynamo_orig_callable")),
            "lora_layers": str(len(lora_b)),
            "lora_b_nonzero": str(all(bool(local(b.default.weight).any()) for b in lora_b)),
            "param_dtypes": ",".join(sorted({str(param.dtype) for param in engine.module.parameters()})),
            "fsdp_param_dtype": str(state._mp_policy.param_dtype if state is not None else None),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def replay_record(self) -> dict[str, list[Any]]:
        """What this rank's colocated replay requests went through since the last call (then cleared): verl's
        engine moves (``engine.to``: device, model flag) and, at each decoder call, (the engine's mode, the
        decoder's ``training`` flag, whether any of its layers has ``gradient_checkpointing`` on)."""
        record = self._record or {"moves": [], "passes": []}
        self._record = None
        return record

    _record: dict[str, list[Any]] | None = None

    def _colocated_replay(self, mrtpo_block: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
        engine = self.actor.engine
        if "to" not in engine.__dict__:  # once: record verl's moves and the state of every decoder call
            verl_to, decoder = engine.to, engine.module.get_decoder()

            def recorded_to(device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> Any:
                self._record = self._record or {"moves": [], "passes": []}
                self._record["moves"].append((str(device), bool(model)))
                return verl_to(device=device, model=model, optimizer=optimizer, grad=grad)

            def record_pass(module: Any, _args: Any) -> None:
                self._record = self._record or {"moves": [], "passes": []}
                checkpointing = any(getattr(layer, "gradient_checkpointing", False) for layer in module.layers)
                self._record["passes"].append((engine.mode, module.training, checkpointing))

            engine.to = recorded_to
            decoder.register_forward_pre_hook(record_pass)
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

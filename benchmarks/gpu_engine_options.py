"""GPU rows of the engine-option matrix (docs/verification.md): the colocated replay with options no CPU run exercises.

One rank of verl's real actor worker (FSDP2 on NCCL, one GPU) per option; each computes the colocated relevance
of the same real batch (SmolLM2-135M-Instruct answers to Spider questions, every reward pair needed), compared
with the same worker without any option (fp32, sdpa). Run by ``python -m benchmarks.gpu_check`` as its
"engine options" stage; the CPU tests cover the other rows (tests/trainer/test_colocated_engine_options_on_cpu.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

MODEL, ACTOR, FSDP = "actor_rollout_ref.model", "actor_rollout_ref.actor", "actor_rollout_ref.actor.fsdp_config"
BF16 = (f"{FSDP}.model_dtype=bf16", f"+{FSDP}.mixed_precision.param_dtype=bf16")
#: verl's default for a trained actor: float32 master shards gathered in bf16 (flash attention, verl's default).
MASTERS = (
    f"+{FSDP}.mixed_precision.param_dtype=bf16",
    f"+{MODEL}.override_config.attn_implementation=flash_attention_2",
)
#: option name → (engine overrides, largest accepted |q - q_plain|[, mrtpo.replay.compute_dtype]). The replay
#: computes in float32 by default, on float32 weights where the engine stores them so (the masters gathered as
#: float32, flash attention replaced by sdpa), else on the bf16 weights (their rounding only); ``tf32`` with TF32
#: matmuls; ``model`` in the engine's dtype (bf16 noise, faster): the times side by side are the price of each.
OPTIONS: dict[str, tuple[tuple[str, ...], float] | tuple[tuple[str, ...], float, str]] = {
    "use_fused_kernels, triton backend": (
        (
            f"{MODEL}.use_fused_kernels=true",
            f"{ACTOR}.use_fused_kernels=true",
            f"{MODEL}.fused_kernel_options.impl_backend=triton",
        ),
        1e-4,
    ),
    "use_remove_padding, flash_attention_2": (
        (
            f"{MODEL}.use_remove_padding=true",
            f"{ACTOR}.use_remove_padding=true",
            f"+{MODEL}.override_config.attn_implementation=flash_attention_2",
            f"+{FSDP}.mixed_precision.param_dtype=bf16",  # flash attention runs in bf16/fp16 only
        ),
        0.03,
    ),
    "param_offload + optimizer_offload": ((f"{FSDP}.param_offload=true", f"{FSDP}.optimizer_offload=true"), 1e-4),
    "offload_policy (FSDP2 CPUOffloadPolicy)": ((f"{FSDP}.offload_policy=true",), 1e-4),
    "bf16 mixed precision over float32 masters, flash_attention_2 (verl's default)": (MASTERS, 1e-4),
    "the same, compute_dtype=tf32": (MASTERS, 0.02, "tf32"),
    "the same, compute_dtype=fp16": (MASTERS, 0.02, "fp16"),
    "the same, compute_dtype=model": (MASTERS, 0.1, "model"),
    "bf16 (model_dtype + mixed precision)": (BF16, 0.01),
    "bf16, compute_dtype=model": (BF16, 0.06, "model"),
    "fp16 (model_dtype + mixed precision)": (
        (f"{FSDP}.model_dtype=fp16", f"+{FSDP}.mixed_precision.param_dtype=fp16"),
        0.01,
    ),
}


def engine_option_results() -> list[tuple[str, str, str, bool]]:
    """Per option: (setting, max |Δq| and the replay's seconds, or the error; reference, ok)."""
    import dataclasses
    import time

    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from mrtpo_cpu.launch import compose_actor_config, save_derived_model
    from mrtpo_verl.batch_keys import RELEVANCE_KEY
    from mrtpo_verl.config import MRTPOConfig, ReplayConfig
    from mrtpo_verl.trainer.replay_stage import build_request
    from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker
    from mrtpo_verl.workers.placement import ColocatedBackend
    from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch  # the tests' real Spider batch

    cfg = MRTPOConfig(reward_keys=REWARD_KEYS, verifier_info_keys=INFO_KEYS, replay=ReplayConfig(micro_batch_size=4))
    data = real_sql_batch()
    needed = torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool)

    def relevance(model_dir: Path, options: tuple[str, ...], compute_dtype: str = "fp32") -> tuple[torch.Tensor, float]:
        pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1, name_prefix="gpu_options")
        config = compose_actor_config(model_dir, 1, options)
        worker = RayClassWithInitArgs(cls=ray.remote(MRTPOActorRolloutRefWorker), config=config, role="actor")
        group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cuda")
        try:
            group.init_model()
            chosen = dataclasses.replace(cfg, replay=dataclasses.replace(cfg.replay, compute_dtype=compute_dtype))
            backend = ColocatedBackend(group, chosen)
            backend.compute_relevance(build_request(data, chosen, needed))  # warm-up: kernels, allocator
            start = time.perf_counter()
            answer = backend.compute_relevance(build_request(data, chosen, needed))
            return answer.batch[RELEVANCE_KEY].float(), time.perf_counter() - start
        finally:
            for handle in group.workers:
                ray.kill(handle)
            for placement_group in pool.pgs or []:
                ray.util.remove_placement_group(placement_group)

    results = []
    ray.init(num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = save_derived_model(Path(tmp) / "model", num_layers=None)
            plain, plain_s = relevance(model_dir, ())
            for name, (options, tolerance, *compute) in OPTIONS.items():
                try:
                    other, seconds = relevance(model_dir, options, *compute)
                    error = float((other - plain).abs().max())
                    reference = f"no option (fp32, sdpa, {plain_s:.2f} s); <= {tolerance:g}"
                    results.append((name, f"max |dq| {error:.2e}, {seconds:.2f} s", reference, error <= tolerance))
                except Exception as failure:  # one option failing must not hide the others
                    results.append((name, f"{type(failure).__name__}: {str(failure)[:100]}", "-", False))
    finally:
        ray.shutdown()
    return results

"""Sizes of a comparison: the CPU run, the GPU run and the CI smoke run.

Every field is a command-line option of ``python -m benchmarks.learning`` too (the preset only
gives defaults). Lengths are tokens; ``steps`` counts verl's global steps; evaluation runs before
training (step 0), every ``test_freq`` steps and at the last step, greedy (``val_kwargs``
temperature 0, one response per prompt), on held-out prompts scored by the same reward functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["PRESETS", "Preset", "preset"]


@dataclass(frozen=True)
class Preset:
    """One comparison's settings, shared by every arm and seed.

    Attributes:
        device: ``cpu`` (verl's trainer on the CPU backend of ``mrtpo_cpu``) or ``gpu``.
        rollout: verl's rollout engine: ``hf`` (CPU backend), ``vllm`` or ``sglang``.
        model_layers: for the embedded SmolLM2-135M-Instruct, keep this many decoder layers (None: all 30).
        train_prompts, val_prompts: sizes of the built demo task's splits (a recipe's data is used whole).
        batch_size: prompts per step; ``n`` responses each (one GDPO/MRTPO group per prompt).
        response_length: ``data.max_response_length`` (training and evaluation).
        lr: actor learning rate (AdamW, verl's default optimiser).
        kl_coef: low-variance KL loss to the reference model; 0 runs without a reference model.
        warmup_steps: MRTPO's smoothstep warm-up of β (``mrtpo.warmup_steps``).
        save_freq: checkpoint every this many steps (what an interrupted run resumes from); -1: never.
        time_budget_s: no new run starts once this much wall time has passed (the rest stays resumable).
        run_timeout_s: one trainer run's wall-clock limit.
        task: the demo task trained when no recipe is given (``benchmarks.learning.tasks.DEMO_TASKS``).
    """

    name: str
    device: str
    rollout: str
    model_layers: int | None
    train_prompts: int
    val_prompts: int
    batch_size: int
    n: int
    response_length: int
    steps: int
    test_freq: int
    save_freq: int
    lr: float
    kl_coef: float
    warmup_steps: int
    seeds: tuple[int, ...]
    arms: tuple[str, ...]
    time_budget_s: float
    run_timeout_s: float
    gpu_memory_utilization: float = 0.3
    task: str = "if_pair"
    extra: tuple[str, ...] = field(default_factory=tuple)

    def with_options(self, **changes: Any) -> Preset:
        """This preset with the given fields replaced (None values are ignored)."""
        return replace(self, **{key: value for key, value in changes.items() if value is not None})


PRESETS: dict[str, Preset] = {
    # Two steps of two arms on a 2-layer cut of SmolLM2: checks that the harness runs, not learning.
    "smoke": Preset(
        name="smoke",
        device="cpu",
        rollout="hf",
        model_layers=2,
        train_prompts=8,
        val_prompts=2,
        batch_size=2,
        n=2,
        response_length=8,
        steps=2,
        test_freq=1,
        save_freq=-1,
        lr=1e-5,
        kl_coef=0.0,
        warmup_steps=2,
        seeds=(0,),
        arms=("gdpo", "mrtpo"),
        time_budget_s=1800,
        run_timeout_s=600,
    ),
    # The full SmolLM2-135M-Instruct on 2 shared CPU cores: 3 arms x 3 seeds x 5 steps of the demo task
    # if_start_end, evaluated after every step, sized for about 90 minutes there (a step takes 60-90 s,
    # an evaluation of 12 prompts 20-50 s, start-up about 2 minutes). A GDPO run at these settings (seed
    # 2) took the greedy evaluation of if_c0 / if_c1 from 1/12 / 0/12 to 12/12 / 11/12 by step 4, the end
    # phrase at 1/12 until step 2, so both rewards move and neither within one step.
    "cpu": Preset(
        name="cpu",
        device="cpu",
        rollout="hf",
        model_layers=None,
        train_prompts=48,
        val_prompts=12,
        batch_size=3,
        n=4,
        response_length=24,
        steps=5,
        test_freq=1,
        save_freq=3,
        lr=5e-5,
        kl_coef=0.0,
        warmup_steps=2,
        seeds=(2, 3, 4),
        arms=("gdpo", "mrtpo", "mrtpo_shuffle"),
        time_budget_s=2 * 3600,
        run_timeout_s=2400,
        task="if_start_end",
    ),
    # One H200-class GPU with verl's vLLM rollout: 3 arms x 2 seeds x 10 steps of 16 prompts x n=8,
    # evaluated every 2 steps on 64 prompts; the KL loss of verl's GRPO recipes (0.001, low-variance) so
    # the KL to the reference is logged. Aimed at 8 minutes in all (start-up of verl and vLLM is most of
    # each run); not measured here (no GPU). The time budget stops launching runs at 8 minutes; the same
    # command then resumes the rest.
    "gpu": Preset(
        name="gpu",
        device="gpu",
        rollout="vllm",
        model_layers=None,
        train_prompts=320,
        val_prompts=64,
        batch_size=16,
        n=8,
        response_length=48,
        steps=10,
        test_freq=2,
        save_freq=5,
        lr=2e-5,
        kl_coef=0.001,
        warmup_steps=3,
        seeds=(0, 1),
        arms=("gdpo", "mrtpo", "mrtpo_shuffle"),
        time_budget_s=480,
        run_timeout_s=480,
    ),
}


def preset(name: str) -> Preset:
    """The preset of that name; an unknown name raises ``ValueError`` listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {list(PRESETS)}")
    return PRESETS[name]

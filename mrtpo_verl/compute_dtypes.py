"""Which model architectures each reduced-precision ``replay.compute_dtype`` can run on: a pure function of the
model's config, read by the start-up check (before any model loads) and by the replay's modes
(:mod:`mrtpo_verl.replay.product_rule`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["EXPERT_COUNT_FIELDS", "REDUCED_COMPUTE_DTYPES", "compute_dtype_refusal"]

#: ``replay.compute_dtype`` values whose modes reduce the precision of weight and attention products.
REDUCED_COMPUTE_DTYPES = ("fp16", "tf32")

#: Config fields that give the number of experts of a mixture-of-experts model (transformers' names).
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def _expert_count(model_config: Any) -> tuple[str, int] | None:
    text_config = getattr(model_config, "get_text_config", None)
    configs = [model_config]
    if callable(text_config):
        configs.append(text_config())
    for config in configs:
        for name in EXPERT_COUNT_FIELDS:
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return name, value
    return None


def compute_dtype_refusal(model_config: Any, compute_dtype: str) -> str | None:
    """Why ``compute_dtype`` cannot run on a model of ``model_config`` (a transformers config), in one line; None when
    it can. A pure function of its arguments, for start-up checks.

    fp16 and tf32 are refused for mixture-of-experts models (``num_experts``, ``num_local_experts`` or
    ``n_routed_experts`` > 0): their experts run through ``grouped_mm`` in the weights' dtype, outside the mode's rule.
    ``auto`` is never refused: it resolves to fp32 for such models
    (:func:`~mrtpo_verl.replay.scorer.compute_dtype_for`).
    """
    if compute_dtype not in REDUCED_COMPUTE_DTYPES or model_config is None:
        return None
    experts = _expert_count(model_config)
    if experts is None:
        return None
    name, count = experts
    return (
        f"mrtpo.replay.compute_dtype={compute_dtype} cannot apply its precision rule to this mixture-of-experts model "
        f"({name}={count}: transformers runs the experts through grouped_mm in the weights' dtype); "
        "use mrtpo.replay.compute_dtype fp32 or model"
    )

"""Start-up check of ``mrtpo.replay.compute_dtype`` against the actor model's architecture (one line per refusal).

The fp16 and tf32 modes reduce only the products their rule can see (:mod:`mrtpo_verl.replay.product_rule`); a
mixture-of-experts model runs its experts through ``grouped_mm``, which the rule cannot reach, so those modes are
refused here from the model's config (:func:`mrtpo_verl.compute_dtypes.compute_dtype_refusal`), before Ray or any
model starts. Where the config cannot be read here (a remote id without a cache), the replay refuses at its first
pass instead.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.compute_dtypes import REDUCED_COMPUTE_DTYPES, compute_dtype_refusal
from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError
from mrtpo_verl.startup.reads import RunReads

__all__ = ["check_compute_dtype"]


def check_compute_dtype(config: DictConfig, mrtpo: MRTPOConfig, reads: RunReads) -> None:
    """Raise :class:`MRTPOConfigError` when ``mrtpo.replay.compute_dtype`` cannot run on the actor model.

    Args:
        config: the whole run config (``actor_rollout_ref.model.path`` names the model).
        mrtpo: the validated ``mrtpo`` block.
        reads: the check's reads (the model config is read once through it).
    """
    path = OmegaConf.select(config, "actor_rollout_ref.model.path")
    if not path or mrtpo.replay.compute_dtype not in REDUCED_COMPUTE_DTYPES:
        return  # fp32 and model compute every product as the model does; auto resolves to fp32 for experts
    trust_remote_code = bool(OmegaConf.select(config, "actor_rollout_ref.model.trust_remote_code", default=False))
    try:
        model_config = reads.model_config(str(path), trust_remote_code)
    except Exception:  # unreadable here: the replay's first pass refuses instead (lengths.py warns once already)
        return
    refusal = compute_dtype_refusal(model_config, mrtpo.replay.compute_dtype)
    if refusal is not None:
        raise MRTPOConfigError(refusal)

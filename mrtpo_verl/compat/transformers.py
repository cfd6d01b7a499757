"""transformers details: the ``DynamicCache`` layout a shared prefix's key/value cache is kept in, and the attention
implementation a model's forward runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["cache_from_layers", "float32_capable_attention", "full_attention_cache_layers"]

KeyValue = tuple[torch.Tensor, torch.Tensor]


def full_attention_cache_layers(cache: Any) -> tuple[KeyValue, ...]:
    """Per layer (keys, values), each (rows, kv_heads, tokens, head_dim), of a full-attention ``DynamicCache``.

    Relies on: transformers ≥ 4.56's ``DynamicCache.layers`` of ``DynamicLayer`` with ``keys``/``values``.

    Raises:
        NotImplementedError: naming the cache and layer kinds, for any other cache (sliding-window, chunked,
            linear-attention/recurrent, quantised, offloaded): their tensors are not the whole prefix.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = getattr(cache, "layers", None)
    if type(cache) is not DynamicCache or not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or ()})
        raise NotImplementedError(
            f"mrtpo replay prefix sharing needs a transformers DynamicCache of full-attention DynamicLayers; this "
            f"model returned {type(cache).__name__} ({', '.join(kinds) or 'no layers'}). "
            "Set mrtpo.replay.share_prefix=false for it"
        )
    return tuple((layer.keys, layer.values) for layer in layers)


def cache_from_layers(layers: tuple[KeyValue, ...], rows: int) -> Any:
    """A fresh ``DynamicCache`` holding one-row ``layers`` expanded to ``rows`` rows; its updates never write
    into ``layers`` (they concatenate into new tensors).

    Relies on: transformers ≥ 4.56's ``DynamicCache(ddp_cache_data=[(keys, values), ...])``.
    """
    from transformers.cache_utils import DynamicCache

    return DynamicCache(ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in layers])


def _half_precision_only(implementation: Any) -> bool:
    """Flash attention kernels (``flash_attention_2``/``_3``, hub kernels named ``...flash...``) take fp16/bf16 only;
    eager, ``sdpa`` and ``flex_attention`` take float32."""
    return isinstance(implementation, str) and "flash" in implementation.lower()


@contextmanager
def float32_capable_attention(model: Any) -> Iterator[list[str]]:
    """Within the block, a model whose attention implementation takes fp16/bf16 only (flash attention: verl's
    default ``attn_implementation``) runs PyTorch's ``sdpa`` instead, which computes in float32 too; restored
    after. Yields the implementations replaced (empty: nothing changed).

    Relies on: transformers ≥ 4.56 reading ``config._attn_implementation`` at every forward (attention layers and
    mask builders), stored in ``_attn_implementation_internal`` on each config and sub-config (set here directly,
    without the property's recursion, so each restores to its own value).
    """
    from transformers import PretrainedConfig

    configs: dict[int, Any] = {}
    pending = [
        module.config for module in model.modules() if isinstance(getattr(module, "config", None), PretrainedConfig)
    ]
    while pending:
        config = pending.pop()
        if id(config) in configs:
            continue
        configs[id(config)] = config
        pending += [getattr(config, key, None) for key in getattr(config, "sub_configs", {})]
        pending = [c for c in pending if isinstance(c, PretrainedConfig)]
    replaced = [c for c in configs.values() if _half_precision_only(getattr(c, "_attn_implementation_internal", None))]
    saved = [(config, config._attn_implementation_internal) for config in replaced]
    try:
        for config, _ in saved:
            config._attn_implementation_internal = "sdpa"
        yield sorted({str(implementation) for _, implementation in saved})
    finally:
        for config, implementation in saved:
            config._attn_implementation_internal = implementation

"""transformers detail: the ``DynamicCache`` layout a shared prefix's key/value cache is kept in."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cache_from_layers", "full_attention_cache_layers"]

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

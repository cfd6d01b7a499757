"""How the replay scorer runs a model: a plain local model, or the actor engine's sharded one.

The scorer (:mod:`mrtpo_verl.replay.scorer`) needs two things of a causal LM:

- ``hidden_states(input_ids, attention_mask, position_ids)`` → (n, P, hidden): the decoder's last
  hidden states (after the final norm), with no logits over the prompt positions;
- ``logits(hidden)`` → (rows, vocab): the LM head applied to chosen rows only;
- for prefix sharing, ``prefix_cache(...)`` → :class:`PrefixCache` (the key/value cache of a shared prefix),
  and ``hidden_states(..., past_key_values=cache)`` for the rows that continue it.

:class:`LocalModelRunner` calls the decoder and the LM head of an ordinary module (a replay worker's
own copy, or an in-process model).

:class:`ShardedModelRunner` runs the actor engine's FSDP-wrapped model in place (colocated
placement). There every forward pass is a collective — each decoder layer all-gathers its shards —
so two rules hold:

1. Only the wrapped root module is called (FSDP's hooks run exactly as in verl's own log-prob pass),
   with ``logits_to_keep=1`` so the LM head touches one position per row; the decoder's output is
   taken by a forward hook. A shared prefix's cache is built by that same root call (``use_cache=True``),
   so building it is one more collective pass like any other.
2. Every rank runs the same number of forward passes: :meth:`agree_on_micro_batches` takes the
   maximum over the process group, and a rank with less work runs one-token idle passes. Otherwise
   the rank with more work would wait forever in an all-gather. A rank that fails before that
   meeting (e.g. on a bad verifier text) still joins it with a failure flag
   (:meth:`release_peers_after_failure`), so every rank raises instead of waiting. The meeting is
   therefore the first collective of a request; the scorer gathers the LM head only after it.

The LM head's weight is used directly (``F.linear``, no FSDP hooks): :meth:`ShardedModelRunner.scoring`
all-gathers the FSDP2 module that owns it once at the start (on every rank) and keeps it unsharded
until scoring ends, then frees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["LocalModelRunner", "ModelRunner", "PrefixCache", "ShardedModelRunner"]


class PrefixCache:
    """The key/value cache of one shared prefix (one row), reusable by any number of later forward calls.

    Held as plain per-layer tensors, (1, kv_heads, D, head_dim) each, so that no later call can grow it:
    :meth:`repeated` builds a fresh transformers ``DynamicCache`` per call (its ``update`` concatenates
    the new tokens into new tensors, leaving these untouched).

    Only caches made of plain ``DynamicLayer`` s (full attention, every token kept) can be reused this way.
    Sliding-window, chunked-attention, linear-attention/recurrent (Mamba-style) and quantised or offloaded
    caches are refused with ``NotImplementedError``: such models must run with ``mrtpo.replay.share_prefix=false``.
    """

    def __init__(self, layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]) -> None:
        self.layers = layers

    @classmethod
    def from_cache(cls, cache: Any) -> PrefixCache:
        from transformers.cache_utils import DynamicCache, DynamicLayer

        layers = getattr(cache, "layers", None)
        if type(cache) is not DynamicCache or not layers or any(type(layer) is not DynamicLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers or ()})
            raise NotImplementedError(
                f"mrtpo replay prefix sharing needs a transformers DynamicCache of full-attention DynamicLayers; this "
                f"model returned {type(cache).__name__} ({', '.join(kinds) or 'no layers'}). "
                "Set mrtpo.replay.share_prefix=false for it"
            )
        if any(layer.keys.shape[0] != 1 for layer in layers):
            raise ValueError(f"a prefix cache holds one row, got {layers[0].keys.shape[0]}")
        return cls(tuple((layer.keys, layer.values) for layer in layers))

    @property
    def length(self) -> int:
        """D, the cached tokens."""
        return int(self.layers[0][0].shape[-2])

    @property
    def nbytes(self) -> int:
        """Bytes held by this one-row cache."""
        return sum(keys.nbytes + values.nbytes for keys, values in self.layers)

    def repeated(self, rows: int) -> Any:
        """A fresh ``DynamicCache`` with this prefix for ``rows`` rows (copied: rows × this cache's bytes)."""
        from transformers.cache_utils import DynamicCache

        return DynamicCache(
            ddp_cache_data=[(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.layers]
        )


class ModelRunner:
    """What :class:`~mrtpo_verl.replay.scorer.ReplayScorer` asks of a model (see the module docstring)."""

    model: Any

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        """(n, P) ids and positions, (n, D + P) mask, optional cache of D tokens → (n, P, hidden) last hidden states."""
        raise NotImplementedError

    def prefix_cache(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> PrefixCache:
        """Run (1, P) tokens after an optional cache of D tokens → the key/value cache of all D + P tokens."""
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, hidden) → (rows, vocab) LM-head logits, in the model's dtype."""
        raise NotImplementedError

    def agree_on_micro_batches(self, local_count: int) -> int:
        """How many forward passes every rank runs, given this rank's own count (local: its own)."""
        return local_count

    def idle_forward(self) -> None:
        """A pass whose result is thrown away, to keep collectives in step (local: nothing to do)."""

    def begin_call(self) -> None:
        """A replay request starts on this rank (local: nothing to track)."""

    def release_peers_after_failure(self) -> None:
        """This rank failed; let the other ranks stop too (local: there are none)."""

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Eval mode and no autograd while scoring; the model's train/eval mode is restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            # no_grad, not inference_mode: tensors FSDP allocates for unsharded parameters while scoring
            # are reused by the next training step, and inference tensors cannot be saved for backward.
            with torch.no_grad():
                yield
        finally:
            self.model.train(was_training)


class LocalModelRunner(ModelRunner):
    """A transformers ``*ForCausalLM`` held whole in this process."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device  # type: ignore[no-any-return]

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        output = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=past_key_values is not None,
        )
        return output.last_hidden_state  # type: ignore[no-any-return]

    def prefix_cache(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> PrefixCache:
        output = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=True,
        )
        return PrefixCache.from_cache(output.past_key_values)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # type: ignore[no-any-return]


class ShardedModelRunner(ModelRunner):
    """The actor engine's FSDP2-wrapped causal LM, run in place by every rank of its process group.

    Args:
        model: the wrapped root module (verl's ``engine.module``), a transformers ``*ForCausalLM``.
        group: the process group whose ranks all run the replay (None: the default group).
        reshard_after_forward: the engine's own setting, restored on the LM head's FSDP owner after scoring.
    """

    def __init__(self, model: Any, group: Any = None, reshard_after_forward: bool = True) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.group = group
        self.reshard_after_forward = reshard_after_forward
        self._agreed = True  # no request in flight

    @property
    def device(self) -> torch.device:
        # With FSDP2 the parameter may be a DTensor; its local shard is on this rank's device.
        weight = self.lm_head.weight
        local = weight.to_local() if hasattr(weight, "to_local") else weight
        return local.device  # type: ignore[no-any-return]

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        use_cache = past_key_values is not None
        hidden, _ = self._root_forward(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        return hidden

    def prefix_cache(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> PrefixCache:
        _, cache = self._root_forward(input_ids, attention_mask, position_ids, past_key_values, True)
        return PrefixCache.from_cache(cache)

    def _root_forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool,
    ) -> tuple[torch.Tensor, Any]:
        """One call of the wrapped root module (one round of FSDP all-gathers) → (decoder states, cache or None)."""
        captured: list[torch.Tensor] = []

        def keep_last_hidden_state(_module: Any, _args: Any, output: Any) -> None:
            captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

        handle = self.decoder.register_forward_hook(keep_last_hidden_state)
        try:
            output = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                logits_to_keep=1,  # the root forward's own logits: one position per row, thrown away
            )
        finally:
            handle.remove()
        if len(captured) != 1:
            raise RuntimeError(f"colocated replay: the decoder ran {len(captured)} times in one forward pass, not once")
        return captured[0], getattr(output, "past_key_values", None) if use_cache else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.lm_head.weight
        if hasattr(weight, "to_local") or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
            raise RuntimeError(
                "colocated replay: the LM head's weight is still sharded while scoring "
                f"({type(weight).__name__} {tuple(weight.shape)}); this FSDP setup is not supported by the colocated "
                "placement — use mrtpo.replay.placement=dedicated"
            )
        return F.linear(hidden, weight, self.lm_head.bias)

    def begin_call(self) -> None:
        """Start of one replay request on this rank: it has not yet met the other ranks."""
        self._agreed = False

    def agree_on_micro_batches(self, local_count: int) -> int:
        """The busiest rank's micro-batch count; raises on every rank if one rank failed before this point."""
        maximum, failed = self._all_reduce_max(local_count, failed=0)
        if failed:
            raise RuntimeError(
                "mrtpo colocated replay: another rank failed before its forward passes (its error is the one to read); "
                "this rank stops too instead of waiting for it"
            )
        return maximum

    def release_peers_after_failure(self) -> None:
        """Call when this rank fails: if it has not met the others yet, tell them (they raise instead of hanging).

        A failure after the meeting (inside the forward passes) cannot be signalled this way; the others then
        wait in FSDP's all-gather until the process group's timeout, as in any of verl's own collective passes.
        """
        if not self._agreed:
            self._all_reduce_max(0, failed=1)

    def _all_reduce_max(self, count: int, failed: int) -> tuple[int, int]:
        import torch.distributed as dist

        self._agreed = True
        if not dist.is_initialized():
            return count, failed
        # A CPU tensor: verl's process groups carry a gloo backend for CPU tensors next to NCCL.
        values = torch.tensor([count, failed], dtype=torch.long)
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        return int(values[0]), int(values[1])

    def idle_forward(self) -> None:
        ones = torch.ones(1, 1, dtype=torch.long, device=self.device)
        self.hidden_states(ones, ones, ones - 1)

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Scoring mode with the LM head's weight gathered once for the whole call and freed after.

        The FSDP2 module that owns the LM head's weight (the LM head itself when it is sharded on its own,
        else the root, e.g. for tied embeddings) is all-gathered here — once on every rank, so still in
        step — and told not to reshard after each forward pass until scoring ends.
        """
        owner = next((m for m in (self.lm_head, self.model) if hasattr(m, "set_reshard_after_forward")), None)
        if owner is not None:
            owner.set_reshard_after_forward(False, recurse=False)
            owner.unshard()
        try:
            with super().scoring():
                yield
        finally:
            if owner is not None:
                owner.set_reshard_after_forward(self.reshard_after_forward, recurse=False)
                owner.reshard()  # local: frees the gathered weights, no communication

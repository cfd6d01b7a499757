"""How the replay scorer runs a model: a plain local model, or the actor engine's sharded one.

A runner gives the scorer ``forward_pass(input_ids, attention_mask, position_ids, past_key_values, keep_cache)``
→ (n, P, hidden) decoder states and, with ``keep_cache``, every layer's keys and values (for prefix sharing; a
shared prefix's rows are cut out as :class:`PrefixCache`), and ``logits(hidden)`` → (rows, vocab) for chosen rows
only. :class:`LocalModelRunner` calls an ordinary
module; :class:`ShardedModelRunner` runs the actor engine's FSDP2 model in place, where every forward pass is a
collective: it calls only the wrapped root (with the decoder's forward), keeps every rank's pass count equal,
and meets the other ranks between passes so that a failing rank stops them all (:class:`PeerFailed`).
The rules in full: ``docs/replay.md`` ("Model runners").
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import Any

import torch
import torch.nn.functional as F

from mrtpo_verl.compat.torch_fsdp import first_fsdp2_module, gathered_as_stored, keep_unsharded, reshard
from mrtpo_verl.compat.transformers import cache_from_layers, full_attention_cache_layers

__all__ = ["LocalModelRunner", "ModelRunner", "PeerFailed", "PrefixCache", "ShardedModelRunner"]


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
        layers = full_attention_cache_layers(cache)
        if any(keys.shape[0] != 1 for keys, _ in layers):
            raise ValueError(f"a prefix cache holds one row, got {layers[0][0].shape[0]}")
        return cls(layers)

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
        return cache_from_layers(self.layers, rows)


class ModelRunner:
    """What :class:`~mrtpo_verl.replay.scorer.ReplayScorer` asks of a model (see the module docstring).

    ``calls_gather_parameters``: each forward call all-gathers parameters across ranks, so fewer calls beat
    fewer tokens (the scorer's ``prefix_schedule="auto"`` then runs two levels of calls, not the whole tree).
    """

    model: Any
    calls_gather_parameters: bool = False

    def computes_in_float32(self) -> bool:
        """True when a forward call already runs every weight in float32 (then no float32-compute mode is needed).

        False unless a runner knows: a sharded model's gathered weights may be bf16 while its shards are fp32.
        """
        return False

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

    def forward_pass(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        keep_cache: bool,
    ) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...] | None]:
        """One call: (n, P) ids and positions, (n, D + P) mask, optional cache of D tokens → (n, P, hidden) last
        hidden states and, with ``keep_cache``, the (keys, values) of every layer, (n, kv_heads, D + P, head_dim)."""
        if keep_cache:
            return self._decoder_pass(input_ids, attention_mask, position_ids, past_key_values, True)
        return self.hidden_states(input_ids, attention_mask, position_ids, past_key_values), None

    def _decoder_pass(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool,
    ) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...] | None]:
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

    def release_peers_after_failure(self, error: BaseException | None = None) -> None:
        """This rank failed with ``error``; let the other ranks stop too (local: there are none)."""

    def weights_as_stored(self, gather_dtype: torch.dtype | None = None) -> Any:
        """A context in which forward calls use the weights as they are stored, not cast to a lower compute dtype
        (a sharded runner: its float32 master shards gathered as float32, or cast to ``gather_dtype`` before the
        gather; local: the model's own weights, nothing to do). Entered outside :meth:`scoring`, so that the
        weights scoring gathers are gathered so too."""
        return nullcontext()

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

    def computes_in_float32(self) -> bool:
        """Every floating parameter is float32 and no autocast is on: the forward already computes in float32."""
        if torch.is_autocast_enabled(self.device.type):
            return False
        return all(p.dtype == torch.float32 for p in self.model.parameters() if p.is_floating_point())

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> torch.Tensor:
        output = self._decode(input_ids, attention_mask, position_ids, past_key_values, past_key_values is not None)
        return output.last_hidden_state  # type: ignore[no-any-return]

    def _decoder_pass(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool,
    ) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...] | None]:
        output = self._decode(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        layers = full_attention_cache_layers(output.past_key_values) if use_cache else None
        return output.last_hidden_state, layers

    def prefix_cache(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any = None,
    ) -> PrefixCache:
        output = self._decode(input_ids, attention_mask, position_ids, past_key_values, True)
        return PrefixCache.from_cache(output.past_key_values)

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool,
    ) -> Any:
        """The decoder's one call (every method above goes through it): its output, with the cache if asked."""
        return self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # type: ignore[no-any-return]


class ShardedModelRunner(ModelRunner):
    """The actor engine's FSDP2-wrapped causal LM, run in place by every rank of its process group.

    Every forward call all-gathers the sharded parameters (``calls_gather_parameters``).

    Args:
        model: the wrapped root module (verl's ``engine.module``): a transformers ``*ForCausalLM``, or a peft
            model around one (LoRA: the decoder's linear layers carry the adapters, so the replay scores with the
            adapted weights, like the policy).
        group: the process group whose ranks all run the replay (None: the default group).
        reshard_after_forward: the engine's own setting, restored on the LM head's FSDP owner after scoring.
        device: where the replay's inputs go, the engine's compute device (None: the device of the LM head's
            local shard, which is wrong when FSDP2 keeps the shards on the CPU, ``offload_policy``).
        autocast_dtype: the engine's autocast dtype (verl's forward runs under ``torch.autocast`` with the
            mixed-precision ``param_dtype``); None or float32: no autocast, as in verl.
    """

    calls_gather_parameters = True

    def __init__(
        self,
        model: Any,
        group: Any = None,
        reshard_after_forward: bool = True,
        device: torch.device | None = None,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.group = group
        self.reshard_after_forward = reshard_after_forward
        self._device = device
        self.autocast_dtype = autocast_dtype
        self._stage = _Stage.IDLE

    @property
    def device(self) -> torch.device:
        if self._device is not None:
            return self._device
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

    def _decoder_pass(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool,
    ) -> tuple[torch.Tensor, tuple[tuple[torch.Tensor, torch.Tensor], ...] | None]:
        hidden, cache = self._root_forward(input_ids, attention_mask, position_ids, past_key_values, use_cache)
        return hidden, full_attention_cache_layers(cache) if use_cache else None

    def _root_forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: Any,
        use_cache: bool,
    ) -> tuple[torch.Tensor, Any]:
        """One call of the wrapped root module (one round of FSDP all-gathers) → (decoder states, cache or None).

        The peers are asked first whether one of them failed (one small collective), so that no rank enters
        the model's all-gathers while another has given up.
        """
        self._check_peers()
        calls: list[Any] = []
        decoder = self.decoder

        def decoder_only(**kwargs: Any) -> Any:
            calls.append(decoder(**kwargs))
            return calls[-1]

        # The root's own forward (possibly verl's fused-kernel forward, which needs return_dict and computes
        # log-probs over every position) is replaced for this call, on this instance only, by the decoder's: FSDP's
        # hooks are module hooks, so they run exactly as for verl's own call, and no LM head runs at all.
        instance_forward = self.model.__dict__.get("forward")
        self.model.forward = decoder_only
        self._stage = _Stage.IN_FORWARD
        try:
            output = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
            )
        finally:
            if instance_forward is None:
                del self.model.forward
            else:
                self.model.forward = instance_forward
        self._stage = _Stage.SCORING
        if len(calls) != 1:
            raise RuntimeError(f"colocated replay: the decoder ran {len(calls)} times in one forward pass, not once")
        return output.last_hidden_state, output.past_key_values if use_cache else None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.lm_head.weight
        if hasattr(weight, "to_local") or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
            raise RuntimeError(
                "colocated replay: the LM head's weight is still sharded while scoring "
                f"({type(weight).__name__} {tuple(weight.shape)}); this FSDP setup is not supported by the colocated "
                "placement — use mrtpo.replay.placement=dedicated"
            )
        return F.linear(hidden, weight, self.lm_head.bias)

    def weights_as_stored(self, gather_dtype: torch.dtype | None = None) -> Any:
        """FSDP2 gathers the shards in their stored dtype (verl's float32 masters under bf16 mixed precision: twice
        the bytes of a bf16 gather), or in ``gather_dtype``, and casts no layer inputs, for the block's passes;
        restored after (local)."""
        return gathered_as_stored(self.model, gather_dtype)

    def begin_call(self) -> None:
        """Start of one replay request on this rank: it has not yet met the other ranks."""
        self._stage = _Stage.BEFORE_MEETING

    def agree_on_micro_batches(self, local_count: int) -> int:
        """The busiest rank's micro-batch count; raises on every rank if one rank failed before this point."""
        counts = self._exchange(local_count, None)
        # No pass on any rank: this was the request's last collective, so a later failure has no one to tell.
        self._stage = _Stage.SCORING if max(counts) else _Stage.IDLE
        return max(counts)

    def release_peers_after_failure(self, error: BaseException | None = None) -> None:
        """Call when this rank fails: the other ranks raise at their next meeting with this rank instead of hanging.

        A failure before the meeting or between two forward passes (building contexts, a NaN in the JS distance,
        running out of memory in the LM head) is sent at the collective the others are about to enter (the meeting,
        the check before their next pass, or the one at the end of scoring), with this rank's message. A failure
        inside a forward pass (between FSDP's all-gathers) cannot be sent this way: the others then wait in the
        all-gather until the process group's timeout, as in any of verl's own collective passes.
        """
        if self._stage in (_Stage.BEFORE_MEETING, _Stage.SCORING):
            message = f"{type(error).__name__}: {error}" if error is not None else "failed"
            # This rank's own failure comes back as PeerFailed (with any other rank's); its own error is raised.
            with suppress(PeerFailed):
                self._exchange(0, message)
        self._stage = _Stage.IDLE

    def _check_peers(self) -> None:
        """Raise :class:`PeerFailed` on every rank if any rank has failed since the last meeting."""
        if self._stage is _Stage.SCORING:
            self._exchange(0, None)

    def _exchange(self, count: int, failure: str | None) -> list[int]:
        """Every rank's ``count``; raises :class:`PeerFailed` (naming each failed rank's message) if any failed.

        One all-gather of a small CPU byte tensor per rank: the count, a failure flag and the failure's message.
        A CPU tensor: verl's process groups carry a gloo backend for CPU tensors next to NCCL.
        """
        import torch.distributed as dist

        if not dist.is_initialized():
            if failure is not None:
                raise PeerFailed([(0, failure)], 0)
            return [count]
        payload = torch.zeros(_PAYLOAD_BYTES, dtype=torch.uint8)
        payload[:8] = torch.tensor([count], dtype=torch.int64).view(torch.uint8)
        if failure is not None:
            text = failure.encode("utf-8")[: _PAYLOAD_BYTES - 9]
            payload[8] = 1
            payload[9 : 9 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        gathered = [torch.empty_like(payload) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(gathered, payload, group=self.group)
        failures = [
            (rank, bytes(row[9:].tolist()).rstrip(b"\0").decode("utf-8", errors="replace"))
            for rank, row in enumerate(gathered)
            if row[8]
        ]
        if failures:
            self._stage = _Stage.IDLE  # every rank leaves the request here, so no further check is due
            raise PeerFailed(failures, dist.get_rank(self.group))
        return [int(row[:8].view(torch.int64)) for row in gathered]

    def idle_forward(self) -> None:
        ones = torch.ones(1, 1, dtype=torch.long, device=self.device)
        self.hidden_states(ones, ones, ones - 1)

    @contextmanager
    def scoring(self) -> Iterator[None]:
        """Scoring mode with the LM head's weight gathered once for the whole call and freed after.

        The FSDP2 module that owns the LM head's weight (the LM head itself when it is sharded on its own,
        else the root, e.g. for tied embeddings) is all-gathered here — once on every rank, so still in
        step — and told not to reshard after each forward pass until scoring ends. The passes and the LM head
        run under the engine's autocast, as verl's own forward does. On leaving normally, the ranks meet once
        more, so that a rank that failed after its last forward pass stops the others too.
        """
        owner = first_fsdp2_module(self.lm_head, self.model)
        if owner is not None:
            self._stage = _Stage.IN_FORWARD  # an all-gather: a failure inside it cannot be sent
            keep_unsharded(owner)
            self._stage = _Stage.SCORING
        # As verl 0.9.1's FSDPEngineWithLMHead.forward_step: autocast to the engine's ``_autocast_dtype``.
        autocast = (
            torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype not in (None, torch.float32)
            else nullcontext()
        )
        try:
            with super().scoring(), autocast:
                yield
            self._check_peers()
            self._stage = _Stage.IDLE
        finally:
            if owner is not None:
                reshard(owner, self.reshard_after_forward)  # local: frees the gathered weights, no communication


class PeerFailed(RuntimeError):
    """Another rank of the colocated replay failed; carries each failed rank's own message.

    Args:
        failures: ``(rank, message)`` of every rank that reported a failure.
        rank: this rank.
    """

    def __init__(self, failures: list[tuple[int, str]], rank: int) -> None:
        self.failures = failures
        named = "; ".join(f"rank {failed}: {message}" for failed, message in failures)
        super().__init__(
            f"mrtpo colocated replay failed on {named} — rank {rank} stopped with it instead of waiting in the "
            "next collective"
        )


class _Stage(enum.Enum):
    """Where a rank is in one colocated replay request (what a failure there can still tell the others)."""

    IDLE = "idle"  # no request, or every rank is past its last collective
    BEFORE_MEETING = "before_meeting"  # the others will meet this rank at agree_on_micro_batches
    SCORING = "scoring"  # between collectives: the others will meet this rank at the next check
    IN_FORWARD = "in_forward"  # inside FSDP's all-gathers: nothing can be sent


#: Bytes each rank sends at a meeting: an int64 count, a failure flag, and the failure's message (UTF-8, cut).
_PAYLOAD_BYTES = 8 + 1 + 503

"""How the replay scorer runs a model: a plain local model, or the actor engine's sharded one.

The scorer (:mod:`mrtpo_verl.replay.scorer`) needs two things of a causal LM:

- ``hidden_states(input_ids, attention_mask, position_ids)`` → (n, P, hidden): the decoder's last
  hidden states (after the final norm), with no logits over the prompt positions;
- ``logits(hidden)`` → (rows, vocab): the LM head applied to chosen rows only.

:class:`LocalModelRunner` calls the decoder and the LM head of an ordinary module (a replay worker's
own copy, or an in-process model).

:class:`ShardedModelRunner` runs the actor engine's FSDP-wrapped model in place (colocated
placement). There every forward pass is a collective — each decoder layer all-gathers its shards —
so two rules hold:

1. Only the wrapped root module is called (FSDP's hooks run exactly as in verl's own log-prob pass),
   with ``logits_to_keep=1`` so the LM head touches one position per row; the decoder's output is
   taken by a forward hook.
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

__all__ = ["LocalModelRunner", "ModelRunner", "ShardedModelRunner"]


class ModelRunner:
    """What :class:`~mrtpo_verl.replay.scorer.ReplayScorer` asks of a model (see the module docstring)."""

    model: Any

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def hidden_states(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """(n, P) ids, mask and positions → (n, P, hidden) last hidden states."""
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
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        output = self.decoder(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        )
        return output.last_hidden_state  # type: ignore[no-any-return]

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
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        captured: list[torch.Tensor] = []

        def keep_last_hidden_state(_module: Any, _args: Any, output: Any) -> None:
            captured.append(output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0])

        handle = self.decoder.register_forward_hook(keep_last_hidden_state)
        try:
            self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=1,  # the root forward's own logits: one position per row, thrown away
            )
        finally:
            handle.remove()
        if len(captured) != 1:
            raise RuntimeError(f"colocated replay: the decoder ran {len(captured)} times in one forward pass, not once")
        return captured[0]

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

"""Replay scorer: per-token relevance ``q_{k,t}`` from prefill passes over the replay contexts.

    q_{k,t} = JS distance( softmax(logits(C, y_<t) / τ), softmax(logits(C_-k, y_<t) / τ) )      t = 0 … T-1

Each context runs once with the response appended; only the T positions that predict response tokens reach
the LM head, ``js_chunk_size`` rows at a time. Pairs that are not needed, and leave-one-outs identical to the
full context, get no pass (q = 0). With ``share_prefix`` every shared context prefix runs once and its
key/value cache serves the passes below it (:mod:`~mrtpo_verl.replay.prefix_tree`). Memory bounds, the
cache budget and the models accepted: ``docs/replay.md`` ("Scorer").
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from mrtpo_verl.compat.torch_fsdp import forward_inputs_uncast
from mrtpo_verl.config import COMPUTE_DTYPES, DEFAULT_MAX_CACHE_BYTES, ReplayConfig
from mrtpo_verl.math.relevance import js_distance_one_to_many
from mrtpo_verl.replay.float32_compute import float32_compute
from mrtpo_verl.replay.model_runners import LocalModelRunner, ModelRunner, PrefixCache
from mrtpo_verl.replay.prefix_tree import PrefixNode, build_prefix_tree

__all__ = ["ReplayInputs", "ReplayResult", "ReplayScorer", "ReplayStats", "cache_bytes_per_token"]

PADDING_SIDES = ("right", "left")
# Config attributes of models whose logits are not plain lm_head(hidden); values that leave logits unchanged.
_LOGIT_POST_PROCESSING = {"final_logit_softcapping": (None, 0, 0.0), "logit_scale": (None, 1, 1.0)}


class ReplayInputs(Protocol):
    """What the scorer needs of one response (``contexts.ReplayContexts`` provides it)."""

    @property
    def full_context_ids(self) -> Sequence[int]: ...

    @property
    def leave_one_out_ids(self) -> Sequence[Sequence[int]]: ...

    @property
    def response_ids(self) -> Sequence[int]: ...


@dataclass
class ReplayStats:
    """Work done by one :meth:`ReplayScorer.score` call.

    Attributes:
        forward_passes: sequences (context + response) scored, i.e. contexts replayed.
        skipped_passes: of the ``bs × (1 + K)`` possible passes, those not run.
        identical_contexts: needed (response, k) pairs whose ``C_-k == C``; q = 0 without a pass.
        replayed_tokens: non-padding tokens fed to the model (shared prefixes counted once).
        padded_tokens: padding tokens fed to the model (cost of batching unequal lengths).
        prefix_tokens_shared: tokens not fed thanks to prefix sharing: Σ (context + response) over the passes
            minus ``replayed_tokens``.
        model_calls: forward calls of the model (micro-batches plus one per shared prefix; idle passes of a
            sharded runner not counted).
        peak_cache_bytes: most key/value-cache bytes held at once (shared prefixes of the current path plus the
            micro-batch's repeated copy); 0 without prefix sharing.
        wall_time_s: wall-clock seconds of the call.
    """

    forward_passes: int = 0
    skipped_passes: int = 0
    identical_contexts: int = 0
    replayed_tokens: int = 0
    padded_tokens: int = 0
    prefix_tokens_shared: int = 0
    model_calls: int = 0
    peak_cache_bytes: int = 0
    wall_time_s: float = 0.0

    def as_metrics(self, prefix: str = "mrtpo/replay/") -> dict[str, float]:
        """Flat ``{prefix + name: value}`` for verl's metric tracking."""
        return {prefix + name: float(value) for name, value in vars(self).items()}


@dataclass
class ReplayResult:
    """Relevance and stats of one :meth:`ReplayScorer.score` call.

    Attributes:
        relevance: (bs, K, response_length) float32 ``q``; 0 at padding and for skipped pairs.
        stats: the work done.
    """

    relevance: torch.Tensor
    stats: ReplayStats = field(default_factory=ReplayStats)


@dataclass(frozen=True)
class _Pass:
    """One sequence to run: ``context + response`` of response ``item``; ``reward`` None for the full context."""

    item: int
    reward: int | None
    context: Sequence[int]
    response: Sequence[int]

    @property
    def length(self) -> int:
        return len(self.context) + len(self.response)


@dataclass
class _Progress:
    """Relevance being filled, passes still to run per response, and the hidden states of half-done responses."""

    relevance: torch.Tensor
    remaining: dict[int, int]
    pending: dict[int, dict[int | None, torch.Tensor]]


class ReplayScorer:
    """Computes relevance ``q`` (bs, K, L) for a batch of responses with one causal LM.

    Args:
        model: a transformers ``*ForCausalLM`` (any device and dtype; put in eval mode during scoring), or a
            :class:`~mrtpo_verl.replay.model_runners.ModelRunner` around one (e.g. the actor engine's sharded model).
        js_chunk_size: response positions per LM-head/JS chunk; peak extra memory is
            (1 + K) × chunk × vocab float32 logits.
        micro_batch_size: at most this many sequences per forward pass.
        max_tokens_per_micro_batch: and at most this many padded tokens (sequences × longest); a longer sequence
            runs alone. Long sequences then run unpadded: padded batches need an attention mask, which on CPU
            (sdpa) made a pair of 4k-token passes 1.5× slower than the two passes run one at a time.
        temperature: the rollout temperature τ; logits are divided by it (in float32) before the softmax.
        padding_side: "right" or "left"; both give the same q (attention mask and position ids follow it).
        share_prefix: run each shared context prefix once and the rest against its key/value cache
            (:mod:`~mrtpo_verl.replay.prefix_tree`); False replays every context from its first token.
        min_shared_tokens: fewest tokens two or more contexts must share to get their own cached prefix.
        max_cache_tokens: with sharing, at most this many rows × (cached prefix + longest remainder) per forward
            call: bounds the key/value cache held at once (a row that alone exceeds it runs alone). None: derived
            from ``max_cache_bytes``.
        max_cache_bytes: with sharing and no ``max_cache_tokens``, the key/value-cache bytes one call may hold
            (None: ``DEFAULT_MAX_CACHE_BYTES``); the token budget is ``max_cache_bytes //``
            :func:`cache_bytes_per_token` of the model (its config, and the dtype its keys and values are computed
            in). Only one of the two may be given.
        compute_dtype: ``"fp32"``: every forward pass and the LM head compute in float32 whatever the weights'
            dtype (:mod:`~mrtpo_verl.replay.float32_compute`; bf16 weights are upcast at each use, an outer
            autocast is turned off); ``"model"``: in the model's own dtype / the runner's autocast dtype.

    Attributes:
        max_cache_tokens: the token budget in force (0 without sharing: no cache is held).
    """

    def __init__(
        self,
        model: Any,
        js_chunk_size: int = 256,
        micro_batch_size: int = 8,
        temperature: float = 1.0,
        padding_side: str = "right",
        max_tokens_per_micro_batch: int = 4096,
        share_prefix: bool = True,
        min_shared_tokens: int = ReplayConfig.min_shared_tokens,
        max_cache_tokens: int | None = None,
        max_cache_bytes: int | None = None,
        compute_dtype: str = "fp32",
    ) -> None:
        sizes = (js_chunk_size, micro_batch_size, max_tokens_per_micro_batch, min_shared_tokens)
        if min(sizes) < 1:
            raise ValueError(
                "js_chunk_size, micro_batch_size, max_tokens_per_micro_batch and min_shared_tokens must be ≥ 1, "
                f"got {', '.join(map(str, sizes))}"
            )
        for name, budget in (("max_cache_tokens", max_cache_tokens), ("max_cache_bytes", max_cache_bytes)):
            if budget is not None and budget < 1:
                raise ValueError(f"{name} must be ≥ 1 (or None), got {budget}")
        if max_cache_tokens is not None and max_cache_bytes is not None:
            raise ValueError(
                f"give max_cache_tokens or max_cache_bytes, not both (got {max_cache_tokens} and {max_cache_bytes})"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if compute_dtype not in COMPUTE_DTYPES:
            raise ValueError(f"compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}")
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")
        self.runner = model if isinstance(model, ModelRunner) else LocalModelRunner(model)
        _refuse_logit_post_processing(self.runner.model)
        self.model = self.runner.model
        self.js_chunk_size = js_chunk_size
        self.micro_batch_size = micro_batch_size
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        self.temperature = float(temperature)
        self.padding_side = padding_side
        self.share_prefix = bool(share_prefix)
        self.min_shared_tokens = min_shared_tokens
        self.compute_dtype = compute_dtype
        self.max_cache_tokens = self._cache_token_budget(max_cache_tokens, max_cache_bytes)

    @classmethod
    def from_config(cls, model: Any, replay: ReplayConfig, padding_side: str = "right") -> ReplayScorer:
        """A scorer with ``mrtpo.replay``'s chunk size, micro-batch size and temperature."""
        return cls(
            model,
            replay.js_chunk_size,
            replay.micro_batch_size,
            replay.temperature,
            padding_side,
            replay.max_tokens_per_micro_batch,
            replay.share_prefix,
            replay.min_shared_tokens,
            replay.max_cache_tokens,
            replay.max_cache_bytes,
            replay.compute_dtype,
        )

    def _cache_token_budget(self, max_cache_tokens: int | None, max_cache_bytes: int | None) -> int:
        """Tokens of key/value cache one call may hold: given, or ``max_cache_bytes`` ÷ the model's bytes per token."""
        if max_cache_tokens is not None:
            return max_cache_tokens
        if not self.share_prefix:
            return 0  # no prefix cache is ever held
        cache_dtype = torch.float32 if self.compute_dtype == "fp32" else _cache_dtype(self.runner)
        per_token = cache_bytes_per_token(getattr(self.model, "config", None), cache_dtype)
        return max(1, (DEFAULT_MAX_CACHE_BYTES if max_cache_bytes is None else max_cache_bytes) // per_token)

    @property
    def device(self) -> torch.device:
        return self.runner.device

    def score(
        self, items: Sequence[ReplayInputs], needed: torch.Tensor, response_length: int | None = None
    ) -> ReplayResult:
        """Relevance of every needed (response, reward) pair.

        Args:
            items: bs responses, each with its full context, K leave-one-out contexts and response ids.
            needed: (bs, K) bool; False pairs get q = 0 and no leave-one-out pass (exact skipping).
            response_length: L, the padded response length of the output (default: the longest response).

        Returns:
            :class:`ReplayResult` with ``relevance`` (bs, K, L) float32 on the model's device.
        """
        start = time.perf_counter()
        num_rewards = _check_inputs(items, needed, response_length)
        longest = max((len(item.response_ids) for item in items), default=0)
        length = longest if response_length is None else response_length
        relevance = torch.zeros(len(items), num_rewards, length, dtype=torch.float32, device=self.device)
        passes, stats = _plan_passes(items, needed.detach().cpu().bool())
        tree = build_prefix_tree(passes, self.min_shared_tokens) if self.share_prefix else PrefixNode(0, 0, (), passes)
        micro_batches = {id(node): self._node_micro_batches(node) for node in tree.walk()}
        # One model call per shared prefix and per micro-batch: what a sharded runner's ranks must agree on.
        calls = len(tree.walk()) - 1 + sum(len(batches) for batches in micro_batches.values())
        # First collective of a sharded runner, before any other (scoring() gathers the LM head): a rank that
        # failed earlier meets the others here and they all stop (see ShardedModelRunner).
        every_rank_runs = self.runner.agree_on_micro_batches(calls)
        if every_rank_runs:
            with self.runner.scoring(), self._computing():
                for _ in range(every_rank_runs - calls):
                    self.runner.idle_forward()
                remaining: dict[int, int] = {}
                for sequence in passes:
                    remaining[sequence.item] = remaining.get(sequence.item, 0) + 1
                self._run_node(tree, None, micro_batches, _Progress(relevance, remaining, {}), stats)
        if relevance.device.type == "cuda":
            torch.cuda.synchronize(relevance.device)
        stats.wall_time_s = time.perf_counter() - start
        return ReplayResult(relevance=relevance, stats=stats)

    @contextmanager
    def _computing(self) -> Iterator[None]:
        """Float32 compute for ``compute_dtype="fp32"`` (entered inside the runner's scoring, so after its
        autocast and with the LM head's weight as scoring gathered it), else nothing."""
        if self.compute_dtype != "fp32":
            yield
            return
        head = getattr(self.runner, "lm_head", None)
        # FSDP2 with mixed precision casts each sharded layer's inputs (the residual stream) to bf16: not here.
        with (
            forward_inputs_uncast(self.model),
            float32_compute(self.device.type, keep_upcast=getattr(head, "weight", None)),
        ):
            yield

    def _node_micro_batches(self, node: PrefixNode) -> list[list[_Pass]]:
        if node.depth == 0:
            return _micro_batches(node.remainders, self.micro_batch_size, self.max_tokens_per_micro_batch)  # type: ignore[arg-type]
        return _micro_batches(
            node.remainders,  # type: ignore[arg-type]
            self.micro_batch_size,
            self.max_tokens_per_micro_batch,
            cached=node.depth,
            max_cache_tokens=self.max_cache_tokens,
        )

    def _run_node(
        self,
        node: PrefixNode,
        parent_cache: PrefixCache | None,
        micro_batches: dict[int, list[list[_Pass]]],
        progress: _Progress,
        stats: ReplayStats,
        held: int = 0,
    ) -> None:
        """Build this node's cache (one call), run its remainders against it, then its children (depth first).

        ``held``: bytes of the ancestors' caches, alive while this subtree runs.
        """
        cache = parent_cache
        if node.depth:
            cache = self._extend(node, parent_cache, stats)
            held += cache.nbytes
        for micro_batch in micro_batches[id(node)]:
            hidden_per_pass = self._response_hidden_states(micro_batch, node.depth, cache, stats, held)
            for sequence, hidden in zip(micro_batch, hidden_per_pass, strict=True):
                progress.pending.setdefault(sequence.item, {})[sequence.reward] = hidden
                progress.remaining[sequence.item] -= 1
                if progress.remaining[sequence.item] == 0:
                    self._relevance_of_response(progress.pending.pop(sequence.item), progress.relevance[sequence.item])
        for child in node.children:
            self._run_node(child, cache, micro_batches, progress, stats, held)

    def _extend(self, node: PrefixNode, parent_cache: PrefixCache | None, stats: ReplayStats) -> PrefixCache:
        """The cache of ``node.depth`` tokens: its own tokens run (one row) after the parent's cache."""
        input_ids = torch.tensor([node.tokens], dtype=torch.long, device=self.device)
        attention_mask = torch.ones(1, node.depth, dtype=torch.long, device=self.device)
        position_ids = torch.arange(node.parent_depth, node.depth, device=self.device)[None]
        past = parent_cache.repeated(1) if parent_cache is not None else None
        cache = self.runner.prefix_cache(input_ids, attention_mask, position_ids, past)
        if cache.length != node.depth:
            raise RuntimeError(f"prefix cache holds {cache.length} tokens, expected {node.depth}")
        stats.model_calls += 1
        stats.replayed_tokens += len(node.tokens)
        stats.prefix_tokens_shared -= len(node.tokens)
        return cache

    def _response_hidden_states(
        self,
        micro_batch: list[_Pass],
        cached: int,
        cache: PrefixCache | None,
        stats: ReplayStats,
        held_bytes: int,
    ) -> list[torch.Tensor]:
        """One padded forward call; per sequence the (T, hidden) states predicting its response.

        Args:
            micro_batch: passes whose first ``cached`` context tokens are in ``cache`` (all of them: 0 and None).
            cached: D, the tokens of the shared prefix; each row runs ``context[D:] + response``.
        """
        input_ids, remainder_mask, offsets = _pad(micro_batch, self.padding_side, self.device, cached)
        # Positions count real tokens only (after the D cached ones), so a left-padded row sees the same positions
        # as a right-padded one; the attention mask covers the cached prefix too.
        position_ids = (cached + remainder_mask.cumsum(dim=-1) - 1).clamp(min=0)
        past = None
        attention_mask = remainder_mask
        if cache is not None:
            past = cache.repeated(len(micro_batch))
            prefix_mask = torch.ones(len(micro_batch), cached, dtype=torch.long, device=self.device)
            attention_mask = torch.cat([prefix_mask, remainder_mask], dim=1)
            # Held at the end of the call: the path's prefixes plus the repeated prefix grown by the remainders.
            grown = cache.nbytes * len(micro_batch) * (cached + remainder_mask.shape[1]) // max(cached, 1)
            stats.peak_cache_bytes = max(stats.peak_cache_bytes, held_bytes + grown)
        hidden = self.runner.hidden_states(input_ids, attention_mask, position_ids, past)  # (n, padded, hidden)
        del past
        real = sum(sequence.length - cached for sequence in micro_batch)
        stats.model_calls += 1
        stats.forward_passes += len(micro_batch)
        stats.replayed_tokens += real
        stats.prefix_tokens_shared += cached * len(micro_batch)
        stats.padded_tokens += int(remainder_mask.numel()) - real
        # Hidden state at position i predicts token i + 1: response token t is predicted at c - D - 1 + t of the
        # remainder. Cloned so that a response still waiting for passes holds (T, hidden), not the whole batch.
        return [
            hidden[row, offset + len(sequence.context) - cached - 1 : offset + sequence.length - cached - 1].clone()
            for row, (sequence, offset) in enumerate(zip(micro_batch, offsets, strict=True))
        ]

    def _relevance_of_response(self, hidden: dict[int | None, torch.Tensor], relevance_row: torch.Tensor) -> None:
        """Fill ``relevance_row`` (K, L) from the full context's and each leave-one-out's (T, hidden) states."""
        full = hidden.pop(None)
        rewards = sorted(reward for reward in hidden if reward is not None)
        num_tokens = full.shape[0]
        for first in range(0, num_tokens, self.js_chunk_size):
            # Bounded by T, not L: the row's columns past the response are padding and stay 0.
            rows = slice(first, min(first + self.js_chunk_size, num_tokens))
            full_logits = self._scaled_logits(full[rows])  # (rows, vocab), computed once for every k
            leave_one_out_logits = torch.stack([self._scaled_logits(hidden[k][rows]) for k in rewards])
            relevance_row[rewards, rows] = js_distance_one_to_many(
                full_logits, leave_one_out_logits, chunk=self.js_chunk_size
            )

    def _scaled_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(rows, hidden) → (rows, vocab) float32 logits / τ (upcast first: bf16 would round the division)."""
        logits: torch.Tensor = self.runner.logits(hidden).float()
        return logits if self.temperature == 1.0 else logits.div_(self.temperature)


def cache_bytes_per_token(model_config: Any, dtype: torch.dtype) -> int:
    """Key/value-cache bytes of one token: 2 (key, value) × layers × kv_heads × head_dim × bytes of ``dtype``.

    Read from a transformers config (its text config for a multimodal one): ``num_hidden_layers``,
    ``num_key_value_heads`` (default ``num_attention_heads``), ``head_dim`` (default
    ``hidden_size // num_attention_heads``).

    Raises:
        ValueError: the config lacks a field, naming it and ``mrtpo.replay.max_cache_tokens`` as the way out.
    """
    text_config = getattr(model_config, "get_text_config", None)
    config = text_config() if callable(text_config) else model_config
    fields: dict[str, int] = {}
    for name in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
        value = getattr(config, name, None)
        if not isinstance(value, int) or value < 1:
            raise ValueError(
                f"the replay cannot size its key/value cache: the model config has no {name} ({value!r}); "
                "set mrtpo.replay.max_cache_tokens"
            )
        fields[name] = value
    kv_heads = getattr(config, "num_key_value_heads", None) or fields["num_attention_heads"]
    head_dim = getattr(config, "head_dim", None) or fields["hidden_size"] // fields["num_attention_heads"]
    return 2 * fields["num_hidden_layers"] * int(kv_heads) * int(head_dim) * dtype.itemsize


def _cache_dtype(runner: ModelRunner) -> torch.dtype:
    """The dtype keys and values are computed in: the runner's autocast dtype, else the model's parameters'."""
    autocast = getattr(runner, "autocast_dtype", None)
    if autocast is not None and autocast != torch.float32:
        return autocast  # type: ignore[no-any-return]
    parameters = getattr(runner.model, "parameters", None)
    floating = (p.dtype for p in parameters() if p.is_floating_point()) if callable(parameters) else iter(())
    return next(floating, torch.float32)


def _refuse_logit_post_processing(model: Any) -> None:
    config = getattr(model, "config", None)
    for attribute, neutral_values in _LOGIT_POST_PROCESSING.items():
        value = getattr(config, attribute, None)
        if value not in neutral_values:
            raise NotImplementedError(
                f"the replay scorer applies lm_head to hidden states itself, but this model post-processes its "
                f"logits ({attribute}={value!r}); such models are not supported"
            )


def _check_inputs(items: Sequence[ReplayInputs], needed: torch.Tensor, response_length: int | None) -> int:
    """Validate shapes; → K."""
    if needed.dim() != 2 or needed.shape[0] != len(items) or needed.dtype != torch.bool:
        raise ValueError(f"needed must be a (bs={len(items)}, K) bool tensor, got {needed.dtype} {tuple(needed.shape)}")
    num_rewards = int(needed.shape[1])
    for index, item in enumerate(items):
        if len(item.leave_one_out_ids) != num_rewards:
            raise ValueError(
                f"item {index} has {len(item.leave_one_out_ids)} leave-one-out contexts, expected {num_rewards}"
            )
        if not item.full_context_ids:
            raise ValueError(f"item {index} has an empty full context; the first response token needs a context")
        if response_length is not None and len(item.response_ids) > response_length:
            raise ValueError(
                f"item {index} has {len(item.response_ids)} response tokens > response_length={response_length}"
            )
    return num_rewards


def _plan_passes(items: Sequence[ReplayInputs], needed: torch.Tensor) -> tuple[list[_Pass], ReplayStats]:
    """The passes to run, in response order with the full context first, and the skip counts.

    Args:
        items: bs responses.
        needed: (bs, K) bool on the CPU.
    """
    stats = ReplayStats()
    passes: list[_Pass] = []
    for index, item in enumerate(items):
        full = list(item.full_context_ids)
        rewards_to_run = []
        for reward in needed[index].nonzero().flatten().tolist():
            if list(item.leave_one_out_ids[reward]) == full:
                stats.identical_contexts += 1
            else:
                rewards_to_run.append(reward)
        if not rewards_to_run or not item.response_ids:
            continue  # nothing to compare: not even the full-context pass
        response = list(item.response_ids)
        passes.append(_Pass(index, None, full, response))
        passes.extend(_Pass(index, k, list(item.leave_one_out_ids[k]), response) for k in rewards_to_run)
    stats.skipped_passes = len(items) * (1 + int(needed.shape[1])) - len(passes)
    return passes, stats


def _micro_batches(
    passes: list[_Pass], max_sequences: int, max_tokens: int, cached: int = 0, max_cache_tokens: int = 0
) -> list[list[_Pass]]:
    """Consecutive passes grouped while ≤ ``max_sequences`` and ``len × longest ≤ max_tokens`` (or alone).

    With a cached prefix of ``cached`` tokens, lengths are the remainders' (``length - cached``) and also
    ``len × (cached + longest) ≤ max_cache_tokens``: the key/value cache rows the call holds.
    """
    groups: list[list[_Pass]] = []
    current: list[_Pass] = []
    longest = 0
    for sequence in passes:
        grown = max(longest, sequence.length - cached)
        over_cache = cached and (len(current) + 1) * (cached + grown) > max_cache_tokens
        if current and (len(current) == max_sequences or (len(current) + 1) * grown > max_tokens or over_cache):
            groups.append(current)
            current, grown = [], sequence.length - cached
        current.append(sequence)
        longest = grown
    if current:
        groups.append(current)
    return groups


def _pad(
    micro_batch: list[_Pass], padding_side: str, device: torch.device, cached: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Pad the sequences' remainders ``context[cached:] + response`` into one batch.

    Returns:
        input_ids (n, P) long, attention_mask (n, P) long over the remainders, and per sequence the index of its
        first real token.
    """
    padded_length = max(sequence.length - cached for sequence in micro_batch)
    input_ids = torch.zeros(len(micro_batch), padded_length, dtype=torch.long)  # pad id is irrelevant: masked out
    attention_mask = torch.zeros(len(micro_batch), padded_length, dtype=torch.long)
    offsets = []
    for row, sequence in enumerate(micro_batch):
        length = sequence.length - cached
        offset = padded_length - length if padding_side == "left" else 0
        real = slice(offset, offset + length)
        input_ids[row, real] = torch.tensor([*sequence.context[cached:], *sequence.response], dtype=torch.long)
        attention_mask[row, real] = 1
        offsets.append(offset)
    return input_ids.to(device), attention_mask.to(device), offsets

"""Replay scorer: per-token relevance ``q_{k,t}`` from prefill passes over the replay contexts.

    q_{k,t} = JS distance( softmax(logits(C, y_<t) / τ), softmax(logits(C_-k, y_<t) / τ) )      t = 0 … T-1

Each context runs once with the response appended; only the T positions that predict response tokens reach
the LM head, ``js_chunk_size`` rows at a time. Pairs that are not needed, and leave-one-outs identical to the
full context, get no pass (q = 0). With ``share_prefix`` every shared context prefix runs once and its
key/value cache serves the passes below it (:mod:`~mrtpo_verl.replay.prefix_tree`). Memory bounds, the
cache budget and the models accepted: ``docs/replay.md`` ("Scorer").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import torch

from mrtpo_verl.compat.transformers import float32_capable_attention
from mrtpo_verl.compute_dtypes import compute_dtype_refusal
from mrtpo_verl.config import (
    COMPUTE_DTYPES,
    DEFAULT_MAX_CACHE_BYTES,
    FLOAT32_COMPUTE_DTYPES,
    PREFIX_SCHEDULES,
    ReplayConfig,
    resolve_compute_dtype,
)
from mrtpo_verl.math.relevance import js_distance_one_to_many
from mrtpo_verl.replay.float32_compute import float32_compute
from mrtpo_verl.replay.fp16_matmuls import float32_output_mm_missing, fp16_matmul_compute
from mrtpo_verl.replay.model_runners import LocalModelRunner, ModelRunner, PrefixCache
from mrtpo_verl.replay.prefix_tree import PrefixNode, build_prefix_tree, two_level_tree
from mrtpo_verl.replay.tf32_matmuls import tf32_in_effect, tf32_matmul_compute

__all__ = ["ReplayInputs", "ReplayResult", "ReplayScorer", "ReplayStats", "cache_bytes_per_token"]

logger = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class _Row:
    """One row of a model call: a remainder ``sequence`` of ``node``, or the own tokens of ``node``'s ``child``.

    Either way it runs after the ``node.depth`` tokens of ``node``'s cache (none at the root).
    """

    node: PrefixNode
    sequence: _Pass | None
    child: PrefixNode | None

    @cached_property
    def tokens(self) -> list[int]:
        """The new tokens the row feeds (built once: the call planning and the call both read them)."""
        if self.child is not None:
            return list(self.child.tokens)
        assert self.sequence is not None
        return [*self.sequence.context[self.node.depth :], *self.sequence.response]


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
        prefix_schedule: with sharing, "two_levels" (the prefixes :func:`~mrtpo_verl.replay.prefix_tree.two_level_tree`
            keeps, each from its first token, in one level of calls, then every pass: about two calls), "tree" (a
            level of calls per level of the tree: fewest tokens, more calls) or "auto" (two levels when every call
            all-gathers sharded parameters, ``runner.calls_gather_parameters``; the tree otherwise).
        max_cache_tokens: with sharing, at most this many rows × (cached prefix + longest remainder) per forward
            call: bounds the key/value cache held at once (a row that alone exceeds it runs alone). None: derived
            from ``max_cache_bytes``.
        max_cache_bytes: with sharing and no ``max_cache_tokens``, the key/value-cache bytes one call may hold
            (None: ``DEFAULT_MAX_CACHE_BYTES``); the token budget is ``max_cache_bytes //``
            :func:`cache_bytes_per_token` of the model (its config, and the dtype its keys and values are computed
            in). Only one of the two may be given.
        compute_dtype: ``"auto"`` (the default): ``"fp16"`` on a CUDA device, ``"fp32"`` elsewhere
            (:func:`~mrtpo_verl.config.resolve_compute_dtype`). ``"fp32"`` / ``"tf32"``: every forward pass and
            the LM head compute in float32 whatever the weights' dtype (:mod:`~mrtpo_verl.replay.float32_compute`;
            ``"tf32"``: TF32 tensor cores on CUDA for the weight and attention products only
            (:mod:`~mrtpo_verl.replay.tf32_matmuls`), IEEE float32 elsewhere; bf16 weights are upcast
            at each use, an outer autocast is turned off), with the weights as stored (a sharded runner gathers its
            float32 master shards as float32, :meth:`ModelRunner.weights_as_stored`); ``"fp16"``: the same float32
            compute, but the weight and attention products (projections, MLP, LM head, q·kᵀ, p·v; not the rotary
            embedding's or any other product: :mod:`~mrtpo_verl.replay.product_rule`) read fp16 inputs with float32
            accumulation (:mod:`~mrtpo_verl.replay.fp16_matmuls`: fp16 tensor cores on CUDA, emulated elsewhere)
            and a sharded runner gathers its shards cast to fp16; ``"model"``: in the model's own dtype / the
            runner's autocast dtype, with the weights as the engine gathers them.

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
        prefix_schedule: str = ReplayConfig.prefix_schedule,
        compute_dtype: str = "auto",
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
        if prefix_schedule not in PREFIX_SCHEDULES:
            raise ValueError(f"prefix_schedule must be one of {PREFIX_SCHEDULES}, got {prefix_schedule!r}")
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
        self.prefix_schedule = _resolve_schedule(prefix_schedule, self.runner)
        self.compute_dtype = compute_dtype_for(compute_dtype, self.device, getattr(self.model, "config", None))
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
            replay.prefix_schedule,
            replay.compute_dtype,
        )

    def _cache_token_budget(self, max_cache_tokens: int | None, max_cache_bytes: int | None) -> int:
        """Tokens of key/value cache one call may hold: given, or ``max_cache_bytes`` ÷ the model's bytes per token."""
        if max_cache_tokens is not None:
            return max_cache_tokens
        if not self.share_prefix:
            return 0  # no prefix cache is ever held
        cache_dtype = torch.float32 if self.compute_dtype in FLOAT32_COMPUTE_DTYPES else _cache_dtype(self.runner)
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
        if self.prefix_schedule == "two_levels":
            tree = two_level_tree(tree)
        levels = self._plan_levels(tree)
        # The model calls, all planned here: what a sharded runner's ranks must agree on.
        calls = sum(len(level) for level in levels)
        # First collective of a sharded runner, before any other (scoring() gathers the LM head): a rank that
        # failed earlier meets the others here and they all stop (see ShardedModelRunner).
        every_rank_runs = self.runner.agree_on_micro_batches(calls)
        if every_rank_runs:
            with self._weights(), self.runner.scoring(), self._computing():
                for _ in range(every_rank_runs - calls):
                    self.runner.idle_forward()
                remaining: dict[int, int] = {}
                for sequence in passes:
                    remaining[sequence.item] = remaining.get(sequence.item, 0) + 1
                progress = _Progress(relevance, remaining, {})
                caches: dict[int, PrefixCache] = {}  # id(node) → its cache, kept while its level's calls run
                for level in levels:
                    made: dict[int, PrefixCache] = {}
                    for call in level:
                        self._run_call(call, caches, made, progress, stats)
                    caches = made
        if relevance.device.type == "cuda":
            torch.cuda.synchronize(relevance.device)
        stats.wall_time_s = time.perf_counter() - start
        return ReplayResult(relevance=relevance, stats=stats)

    def _weights(self) -> Any:
        """For the float32 compute dtypes, the weights as stored (a sharded model's float32 masters, not their bf16
        gather: then relevance is the float32 model's; and no FSDP2 cast of each sharded layer's inputs, the
        residual stream, to bf16), else as the engine computes with them."""
        if self.compute_dtype not in FLOAT32_COMPUTE_DTYPES:
            return nullcontext()
        return self.runner.weights_as_stored(torch.float16 if self.compute_dtype == "fp16" else None)

    @contextmanager
    def _computing(self) -> Iterator[None]:
        """Float32 compute for ``compute_dtype`` fp32 / tf32 / fp16 (entered inside the runner's scoring, so after its
        autocast and with the LM head's weight as scoring gathered it), else nothing. A float32 model held whole
        already computes in float32: only the matmul precision is set, without the mode's per-call dispatch."""
        if self.compute_dtype not in FLOAT32_COMPUTE_DTYPES:
            yield
            return
        # Flash attention (verl's default attn_implementation) takes bf16/fp16 only: sdpa for these passes.
        with float32_capable_attention(self.model):
            head = getattr(self.runner, "lm_head", None)
            # fp16 / tf32 reduce only the weight and attention products (mrtpo_verl.replay.product_rule); tf32 is
            # IEEE float32 where there is no TF32 unit (a CPU), unless emulated_products() is open.
            reduced = self.compute_dtype == "fp16" or (self.compute_dtype == "tf32" and tf32_in_effect(self.device))
            if reduced:
                compute = fp16_matmul_compute if self.compute_dtype == "fp16" else tf32_matmul_compute
                with compute(self.device, keep_upcast=getattr(head, "weight", None), model=self.model):
                    yield
                return
            if self.runner.computes_in_float32():
                with float32_compute(self.device.type, upcast=False):
                    yield
                return
            with float32_compute(self.device.type, keep_upcast=getattr(head, "weight", None)):
                yield

    def _plan_levels(self, tree: PrefixNode) -> list[list[list[_Row]]]:
        """The model calls, level by level of the prefix tree: per level, its calls, each a list of rows.

        Level ``i`` runs, for every node at depth ``i`` of the tree (the root is level 0), its remainders (against
        the node's cache) and its children's own tokens (against the same cache, keeping the child's cache for level
        ``i + 1``), all in as few calls as the budgets allow (:func:`_calls`): rows of different nodes share a call,
        each with its own cached prefix (left-padded to the call's longest).
        """
        levels: list[list[list[_Row]]] = []
        frontier = [tree]
        while frontier:
            rows = []
            for node in frontier:
                rows += [_Row(node, sequence, None) for sequence in node.remainders]  # type: ignore[arg-type]
                rows += [_Row(node, None, child) for child in node.children]
            if rows:
                levels.append(
                    _calls(rows, self.micro_batch_size, self.max_tokens_per_micro_batch, self.max_cache_tokens)
                )
            frontier = [child for node in frontier for child in node.children]
        return levels

    def _run_call(
        self,
        rows: list[_Row],
        caches: dict[int, PrefixCache],
        made: dict[int, PrefixCache],
        progress: _Progress,
        stats: ReplayStats,
    ) -> None:
        """One padded forward call of ``rows``: remainders reduced to relevance when their response is complete,
        children's caches put in ``made``.

        Each row ``i`` continues the cache of ``D_i`` tokens of its node (none at the root): the caches are
        left-padded to the call's longest ``D`` (padding masked out), the new tokens padded on ``padding_side``;
        position ids count real tokens from ``D_i``, so every row sees exactly the tokens and positions of its own
        unshared replay.
        """
        device = self.device
        new_tokens = [row.tokens for row in rows]
        input_ids, remainder_mask, offsets = _pad(new_tokens, self.padding_side, device)
        cached = [row.node.depth for row in rows]
        longest_cached = max(cached)
        position_ids = (torch.tensor(cached, device=device)[:, None] + remainder_mask.cumsum(dim=-1) - 1).clamp(min=0)
        attention_mask = remainder_mask
        past = None
        held = sum(cache.nbytes for cache in caches.values()) + sum(cache.nbytes for cache in made.values())
        if longest_cached:
            past, cache_mask, per_token = _batched_cache([caches.get(id(row.node)) for row in rows], longest_cached)
            attention_mask = torch.cat([cache_mask.to(device), remainder_mask], dim=1)
            grown = per_token * len(rows) * (longest_cached + remainder_mask.shape[1])
            stats.peak_cache_bytes = max(stats.peak_cache_bytes, held + grown)
        keep_cache = any(row.child is not None for row in rows)
        hidden, layers = self.runner.forward_pass(input_ids, attention_mask, position_ids, past, keep_cache)
        del past
        real = sum(len(tokens) for tokens in new_tokens)
        stats.model_calls += 1
        stats.replayed_tokens += real
        stats.padded_tokens += int(remainder_mask.numel()) - real
        for index, (row, offset) in enumerate(zip(rows, offsets, strict=True)):
            depth = row.node.depth
            if row.child is not None:
                assert layers is not None
                # The child's cache: the row's cached tokens and its own new ones, without any padding.
                start = longest_cached + offset
                kept = [*range(longest_cached - depth, longest_cached), *range(start, start + len(row.tokens))]
                made[id(row.child)] = _row_cache(layers, index, kept)
                stats.prefix_tokens_shared -= len(row.tokens)
                continue
            sequence = row.sequence
            assert sequence is not None
            stats.forward_passes += 1
            stats.prefix_tokens_shared += depth
            # Hidden state at position i predicts token i + 1: response token t is predicted at c - D - 1 + t of
            # the remainder. Cloned so that a response still waiting for passes holds (T, hidden), not the batch.
            first = offset + len(sequence.context) - depth - 1
            state = hidden[index, first : first + len(sequence.response)].clone()
            progress.pending.setdefault(sequence.item, {})[sequence.reward] = state
            progress.remaining[sequence.item] -= 1
            if progress.remaining[sequence.item] == 0:
                self._relevance_of_response(progress.pending.pop(sequence.item), progress.relevance[sequence.item])
        del layers, hidden

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


_LOGGED_RESOLUTIONS: set[tuple[str, str]] = set()


def compute_dtype_for(requested: str, device: torch.device, model_config: Any = None) -> str:
    """``replay.compute_dtype`` for a scorer on ``device``: ``auto`` resolved (:func:`resolve_compute_dtype`), and
    said once per process and device. Where ``auto`` would choose fp16 but this torch has no fp16 matmul with
    float32 output on the device, ``auto`` takes tf32 (TF32's 10 mantissa bits, as fp16's, at half fp16's rate) and
    says why; an explicit ``fp16`` is refused there instead (:func:`require_float32_output_mm`, at the first pass).
    Where ``model_config`` refuses fp16 (:func:`~mrtpo_verl.compute_dtypes.compute_dtype_refusal`: a
    mixture-of-experts model), ``auto`` takes fp32 and says why; an explicit fp16 / tf32 is refused at the first pass.
    """
    resolved = resolve_compute_dtype(requested, device.type)
    if requested != "auto":
        return resolved
    why = ""
    if resolved == "fp16" and compute_dtype_refusal(model_config, "fp16") is not None:
        resolved, why = "fp32", " (a mixture-of-experts model: its grouped_mm experts are outside the fp16 rule)"
    if resolved == "fp16":
        missing = float32_output_mm_missing(device)
        if missing is not None:
            resolved, why = "tf32", f" (no fp16 matmul with float32 output here: {missing})"
    if (resolved, str(device)) not in _LOGGED_RESOLUTIONS:
        _LOGGED_RESOLUTIONS.add((resolved, str(device)))
        logger.log(
            logging.WARNING if why else logging.INFO,
            "mrtpo replay: compute_dtype auto -> %s on %s%s",
            resolved,
            device,
            why,
        )
    return resolved


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


def _calls(rows: list[_Row], max_rows: int, max_tokens: int, max_cache_tokens: int) -> list[list[_Row]]:
    """Consecutive rows grouped into calls while ``≤ max_rows`` rows, ``rows × longest new ≤ max_tokens`` and, when a
    row continues a cache, ``rows × (longest cached + longest new) ≤ max_cache_tokens`` (a row alone always runs).
    """
    calls: list[list[_Row]] = []
    current: list[_Row] = []
    longest = cached = 0
    for row in rows:
        grown, grown_cached = max(longest, len(row.tokens)), max(cached, row.node.depth)
        count = len(current) + 1
        over = (
            count > max_rows
            or count * grown > max_tokens
            or (grown_cached and count * (grown_cached + grown) > max_cache_tokens)
        )
        if current and over:
            calls.append(current)
            current, grown, grown_cached = [], len(row.tokens), row.node.depth
        current.append(row)
        longest, cached = grown, grown_cached
    if current:
        calls.append(current)
    return calls


def _batched_cache(caches: list[PrefixCache | None], length: int) -> tuple[Any, torch.Tensor, int]:
    """One ``DynamicCache`` of ``len(caches)`` rows, each row's cache left-padded with zeros to ``length`` tokens.

    Returns:
        The cache, its (rows, length) long mask (0 on padding) on the CPU, and the bytes of one row's cached token.
    """
    from mrtpo_verl.compat.transformers import cache_from_layers

    present = next(cache for cache in caches if cache is not None)
    mask = torch.zeros(len(caches), length, dtype=torch.long)
    layers = []
    for layer, (keys, values) in enumerate(present.layers):
        batched_keys = keys.new_zeros(len(caches), keys.shape[1], length, keys.shape[3])
        batched_values = values.new_zeros(len(caches), values.shape[1], length, values.shape[3])
        for row, cache in enumerate(caches):
            if cache is None:
                continue
            depth = cache.length
            batched_keys[row, :, length - depth :] = cache.layers[layer][0][0]
            batched_values[row, :, length - depth :] = cache.layers[layer][1][0]
            mask[row, length - depth :] = 1
        layers.append((batched_keys, batched_values))
    return cache_from_layers(tuple(layers), len(caches)), mask, present.nbytes // present.length


def _row_cache(layers: tuple[tuple[torch.Tensor, torch.Tensor], ...], row: int, positions: list[int]) -> PrefixCache:
    """The one-row cache of ``row`` of a call's ``layers`` at the cache ``positions`` (copied, so the call's frees)."""
    index = torch.tensor(positions, device=layers[0][0].device)
    return PrefixCache(
        tuple(
            (keys[row : row + 1].index_select(2, index), values[row : row + 1].index_select(2, index))
            for keys, values in layers
        )
    )


def _pad(
    rows: list[list[int]], padding_side: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Pad token lists into one batch.

    Returns:
        input_ids (n, P) long, attention_mask (n, P) long, and per row the index of its first real token.
    """
    padded_length = max(len(tokens) for tokens in rows)
    input_ids = torch.zeros(len(rows), padded_length, dtype=torch.long)  # pad id is irrelevant: masked out
    attention_mask = torch.zeros(len(rows), padded_length, dtype=torch.long)
    offsets = []
    for row, tokens in enumerate(rows):
        offset = padded_length - len(tokens) if padding_side == "left" else 0
        input_ids[row, offset : offset + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        attention_mask[row, offset : offset + len(tokens)] = 1
        offsets.append(offset)
    return input_ids.to(device), attention_mask.to(device), offsets


def _resolve_schedule(prefix_schedule: str, runner: ModelRunner) -> str:
    """``auto``: two levels of calls where each call costs a parameter all-gather, else the fewest tokens."""
    if prefix_schedule != "auto":
        return prefix_schedule
    return "two_levels" if runner.calls_gather_parameters else "tree"

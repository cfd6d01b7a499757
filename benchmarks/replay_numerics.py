"""``python -m benchmarks.replay_numerics``: how much of the replay's relevance is numerical noise, in float32 and bf16.

Relevance is ``q_{k,t} = sqrt(JSD_2(p(·|C, y_<t) ‖ p(·|C_-k, y_<t)))``. The square root turns tiny divergences
into visible distances (JSD = 1e-6 bits gives q = 1e-3), so two forward passes of the *same* context that
differ only in how they were batched already give q > 0. This script measures that noise floor next to the
signal, on SmolLM2-135M-Instruct (CPU) and the three task families' real prompts, with responses the model
samples itself and verifier texts from the families' real reward functions.

Per family and dtype (float32, bf16) it prints, over every response token (median and 99th percentile):

- **noise floor**: the JS distance between the full context's next-token distribution computed alone
  (unpadded, batch of one) and the same context computed

  - in a batch with the group's other full contexts, right-padded (batch neighbours + padding length),
  - in that batch left-padded (padding side; position ids follow the real tokens),
  - alone with 37 extra padding columns (padding length only),
  - through a key/value cache of its first half (the prefix-sharing path);

- **signal**: the replay's leave-one-out relevance ``q`` (the real :class:`ReplayScorer`, default settings);
- **agreement of bf16 with float32 relevance**, per (response, reward) row with a real leave-one-out context:
  Pearson correlation, max |Δq|, max |Δw| of the token weights at β = 0.5 (``w = ½ + ½ q/q̄``), and the share
  of rows whose top-10% tokens change. Also for a bf16 decoder with the LM head applied in float32
  (``head fp32``), to show how much of the disagreement the head's precision causes, and for
  ``compute_dtype=fp32`` on bf16 weights (upcast at each use, float32 arithmetic throughout: what the replay
  computes where the weights are only held in bf16, e.g. ``replay.dedicated_dtype: bf16``; by default the replay
  uses float32 weights, the colocated one by gathering verl's float32 master shards as float32, so its relevance
  is the float32 row's, tested on verl's FSDP2 engine to 1e-5). The colocated rows run on the actor's own FSDP2
  module (bf16 mixed precision over float32 masters) per ``compute_dtype``: fp32 (``auto``'s choice on a CPU), tf32
  (emulated: :func:`~mrtpo_verl.replay.product_rule.emulated_products`), fp16 (``auto``'s choice on CUDA: the
  masters gathered as fp16, weight and attention products on fp16 inputs with float32 accumulation, emulated here
  exactly but for the order of summation) and ``model`` (verl's bf16 way). The replay seconds are this CPU's: the
  emulated rows say nothing of a GPU's time (``benchmarks.gpu_check`` times the dtypes there).

The bf16 model is the float32 one with its parameters cast to bf16 and its buffers left float32
(:func:`~mrtpo_verl.replay.model_loading.cast_parameters`), as ``from_pretrained(dtype=bf16)`` and FSDP's mixed
precision make it: ``model.to(bf16)`` would also round RoPE's ``inv_freq``, a model change of its own that grows
with the position (it took text-to-SQL's long prompts from 0.005 to 0.03 in max |Δq|).

**Long contexts** (``--long-starts``): per band of response positions (responses starting near 550, 2,150, 4,250 and
7,950 of the model's 8,192), one real Spider replay (:func:`long_context_item`: worked Spider examples as the long
prompt, three verifier blocks, the reference query as the response) through the public :class:`ReplayScorer` in fp16,
tf32 (emulated) and fp32 on the colocated FSDP2 module, each against the float32 model in IEEE float32.

Writes the tables to stdout and, with ``--out``, to a markdown file.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.machine import machine_description
from mrtpo_verl.analysis.agreement import agreement, agreement_rows
from mrtpo_verl.analysis.long_context import long_context_item, long_context_relevance
from mrtpo_verl.math.relevance import js_distance
from mrtpo_verl.replay.contexts import ReplayContextBuilder
from mrtpo_verl.replay.model_runners import LocalModelRunner, ShardedModelRunner
from mrtpo_verl.replay.product_rule import emulated_products
from mrtpo_verl.replay.scorer import ReplayScorer

TASKS = ("text_to_sql", "tool_calling", "instruction_following")
EXTRA_PADDING = 37
BETA = 0.5


class Float32HeadRunner(LocalModelRunner):
    """The model's decoder in its own dtype, the LM head in float32 (hidden states and weight upcast)."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden.float(), self.lm_head.weight.float())


@dataclass
class FamilyNumerics:
    """Everything measured on one family."""

    task: str
    responses: int
    response_tokens: int
    noise: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # dtype → variant → per-token q
    signal: dict[str, list[float]] = field(default_factory=dict)  # dtype → per-token leave-one-out q
    agreement: dict[str, dict[str, float]] = field(default_factory=dict)  # bf16 path name → figures
    replay_seconds: dict[str, float] = field(default_factory=dict)
    floor: dict[str, float] = field(default_factory=dict)  # dtype → median noise floor over every variant


def _decoder_logits(model: Any, rows: Sequence[Sequence[int]], side: str, extra: int = 0) -> list[torch.Tensor]:
    """Per row, float32 logits (n_i, vocab) at every position, from one padded decoder call over all rows."""
    width = max(len(row) for row in rows) + extra
    pad = 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        cols = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        input_ids[i, cols] = torch.tensor(row)
        mask[i, cols] = 1
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=input_ids, attention_mask=mask, position_ids=positions).last_hidden_state
        out = []
        for i, row in enumerate(rows):
            start = 0 if side == "right" else width - len(row)
            out.append(model.get_output_embeddings()(hidden[i, start : start + len(row)]).float())
    return out


def _cached_logits(model: Any, row: Sequence[int], cached: int) -> torch.Tensor:
    """Float32 logits at every position of ``row``, its first ``cached`` tokens through a key/value cache."""
    decoder = model.get_decoder()
    ids = torch.tensor([list(row)])
    with torch.no_grad():
        prefix = decoder(
            input_ids=ids[:, :cached],
            attention_mask=torch.ones(1, cached, dtype=torch.long),
            position_ids=torch.arange(cached)[None],
            use_cache=True,
        )
        rest = decoder(
            input_ids=ids[:, cached:],
            attention_mask=torch.ones(1, len(row), dtype=torch.long),
            position_ids=torch.arange(cached, len(row))[None],
            past_key_values=prefix.past_key_values,
            use_cache=True,
        )
        hidden = torch.cat([prefix.last_hidden_state, rest.last_hidden_state], dim=1)[0]
        return model.get_output_embeddings()(hidden).float()


def noise_floor(
    model: Any, full_contexts: Sequence[Sequence[int]], response_lengths: Sequence[int]
) -> dict[str, list[float]]:
    """variant → per response token JS distance to the same context computed alone (see the module docstring)."""
    alone = [_decoder_logits(model, [row], "right")[0] for row in full_contexts]
    # Neighbours: the group's other full contexts plus one longer row, so that every row of the batch is padded.
    longest = max(full_contexts, key=len)
    neighbours = [*full_contexts, [*longest, *longest[:EXTRA_PADDING]]]
    count = len(full_contexts)
    variants = {
        "batched, right-padded": _decoder_logits(model, neighbours, "right")[:count],
        "batched, left-padded": _decoder_logits(model, neighbours, "left")[:count],
        f"alone, +{EXTRA_PADDING} padding": [
            _decoder_logits(model, [row], "right", EXTRA_PADDING)[0] for row in full_contexts
        ],
        "prefix cache (first half)": [_cached_logits(model, row, len(row) // 2) for row in full_contexts],
    }
    out: dict[str, list[float]] = {}
    for name, logits in variants.items():
        values: list[float] = []
        for row, reference, other, length in zip(full_contexts, alone, logits, response_lengths, strict=True):
            positions = slice(len(row) - length - 1, len(row) - 1)  # the positions predicting response tokens
            values += js_distance(reference[positions], other[positions], backend="torch").abs().tolist()
        out[name] = values
    return out


def fsdp2_mixed_precision(model32: Any) -> Any:
    """A copy of the float32 model sharded as verl's engine shards a trained actor: FSDP2 on each decoder layer and
    the root, float32 master shards, bf16 mixed precision (``param_dtype``), here on a one-rank gloo group (started
    on first use, in this process)."""
    import tempfile

    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    model = copy.deepcopy(model32)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model.eval()


#: The colocated replay's rows: verl's bf16 mixed precision over float32 masters (FSDP2), by compute_dtype.
COLOCATED_DEFAULT = "colocated FSDP2 bf16 mixed precision, compute_dtype fp32 (auto on CPU)"
COLOCATED_TF32 = "colocated FSDP2 bf16 mixed precision, compute_dtype tf32 (emulated)"
COLOCATED_MODEL = "colocated FSDP2 bf16 mixed precision, compute_dtype model"
COLOCATED_FP16 = "colocated FSDP2 bf16 mixed precision, compute_dtype fp16 (auto on CUDA; emulated)"


def measure_family(
    model32: Any, model16: Any, tokenizer: Any, task: str, samples: int, max_new_tokens: int
) -> FamilyNumerics:
    from benchmarks.replay_families import family_batch

    batch = family_batch(model32, tokenizer, task, samples, max_new_tokens, seed=0)
    builder = ReplayContextBuilder(tokenizer, batch.reward_keys, max_context_tokens=8192)
    items = builder.build_batch([batch.prompt] * len(batch.responses), batch.responses, batch.infos)
    lengths, real_loo = agreement_rows(items)
    full = [[*item.full_context_ids, *item.response_ids] for item in items]
    needed = torch.ones(len(items), len(batch.reward_keys), dtype=torch.bool)
    result = FamilyNumerics(task, len(items), sum(lengths))
    relevance: dict[str, torch.Tensor] = {}
    # (model or runner, compute_dtype): bf16 computed as bf16 (the engine's dtype), with an fp32 head, and the
    # replay's default, bf16 weights computed in float32.
    runners = {
        "float32": (model32, "fp32"),
        "bf16": (model16, "model"),
        "bf16, head fp32": (Float32HeadRunner(model16), "model"),
        "bf16 weights, fp32 compute": (model16, "fp32"),
    }
    # The colocated replay on the actor's own FSDP2 module (ShardedModelRunner, under the engine's bf16 autocast):
    # by default the float32 masters gathered as float32 and float32 compute; with compute_dtype=model, verl's way.
    sharded = ShardedModelRunner(fsdp2_mixed_precision(model32), autocast_dtype=torch.bfloat16)
    runners[COLOCATED_DEFAULT] = (sharded, "fp32")
    runners[COLOCATED_TF32] = (sharded, "tf32")
    runners[COLOCATED_MODEL] = (sharded, "model")
    runners[COLOCATED_FP16] = (sharded, "fp16")
    for name, (model, compute_dtype) in runners.items():
        start = time.perf_counter()
        with torch.no_grad(), emulated_products() if name == COLOCATED_TF32 else nullcontext():
            relevance[name] = ReplayScorer(model, compute_dtype=compute_dtype).score(items, needed).relevance
        result.replay_seconds[name] = time.perf_counter() - start
    for name, model in (("float32", model32), ("bf16", model16)):
        result.noise[name] = noise_floor(model, full, lengths)
        result.signal[name] = [
            value
            for i, length in enumerate(lengths)
            for k in range(len(batch.reward_keys))
            if real_loo[i, k]
            for value in relevance[name][i, k, :length].tolist()
        ]
    # Noise adds to the divergence roughly in quadrature (JSD is quadratic in small perturbations), so the
    # floor-subtracted relevance is sqrt(max(0, q² − f²)) with f the bf16 noise floor's median over every variant.
    floor = statistics.median(v for values in result.noise["bf16"].values() for v in values)
    result.floor["bf16"] = floor
    relevance[f"bf16, floor {floor:.3f} subtracted"] = (relevance["bf16"].square() - floor**2).clamp(min=0).sqrt()
    for name in relevance:
        if name != "float32":
            result.agreement[name] = agreement(relevance["float32"], relevance[name], lengths, real_loo)
    return result


#: Where the long-context bands put the response's first token (the model's context is 8,192 positions).
LONG_CONTEXT_STARTS = (550, 2150, 4250, 7950)
#: Compute dtypes of the long-context rows, each against the float32 model computed in IEEE float32.
LONG_CONTEXT_MODES = ("fp16", "tf32 (emulated)", "fp32 (colocated FSDP2)")


@dataclass
class BandAgreement:
    """One long-context row: a mode's agreement with the float32 model in one band of response positions."""

    start: int
    end: int
    mode: str
    figures: dict[str, float]
    seconds: float


def measure_long_contexts(
    model32: Any, tokenizer: Any, starts: Sequence[int], modes: Sequence[str]
) -> list[BandAgreement]:
    """Per response start and mode, the agreement of the mode's relevance with the float32 model's."""
    sharded = None
    if any("FSDP2" in mode for mode in modes):
        sharded = ShardedModelRunner(fsdp2_mixed_precision(model32), autocast_dtype=torch.bfloat16)
    rows = []
    for start in starts:
        item = long_context_item(tokenizer, start)
        lengths, real = agreement_rows([item])
        first = len(item.full_context_ids)
        print(f"band {first}-{first + lengths[0]}: reference ...", file=sys.stderr, flush=True)
        reference = long_context_relevance(model32, item, "reference")
        for mode in modes:
            began = time.perf_counter()
            relevance = long_context_relevance(model32, item, mode, sharded)
            seconds = time.perf_counter() - began
            figures = agreement(reference, relevance, lengths, real)
            rows.append(BandAgreement(first, first + lengths[0], mode, figures, seconds))
            print(f"  {mode}: max |dq| {rows[-1].figures['max_dq']:.4f} ({seconds:.0f} s)", file=sys.stderr, flush=True)
    return rows


def long_context_report(rows: Sequence[BandAgreement]) -> str:
    lines = [
        "Long contexts: relevance against the float32 model's (IEEE float32) per band of response positions, one "
        "real Spider replay per band (K = 3 verifier blocks after a long prompt), w at β = "
        f"{BETA}:",
        "",
        "| response positions | compute_dtype | rows | Pearson min | max \\|Δq\\| (float32 q there) | max \\|Δw\\| "
        "| replay s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        f = row.figures
        lines.append(
            f"| {row.start}–{row.end} | {row.mode} | {f['rows']:.0f} | {f['pearson_min']:.4f} | "
            f"{_small(f['max_dq'])} ({f['q_at_max_dq']:.3f}) | {_small(f['max_dw'])} | {row.seconds:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _small(value: float) -> str:
    """Four decimals, or two significant digits below 1e-4 (a float32 rounding difference is not "0.0000")."""
    return f"{value:.4f}" if value >= 1e-4 or value == 0 else f"{value:.1e}"


def _quantiles(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return f"{statistics.median(ordered):.2e} / {p99:.2e}"


def report(families: Sequence[FamilyNumerics], header: Sequence[str]) -> str:
    lines = ["```", *header, "```", ""]
    lines += [
        "Noise floor (same full context, computed differently) next to the signal (leave-one-out relevance), "
        "JS distance per response token, median / 99th percentile:",
        "",
        "| family | dtype | what | median / p99 |",
        "|---|---|---|---|",
    ]
    for family in families:
        for dtype in ("float32", "bf16"):
            for variant, values in family.noise[dtype].items():
                lines.append(f"| {family.task} | {dtype} | noise: {variant} | {_quantiles(values)} |")
            lines.append(
                f"| {family.task} | {dtype} | **signal: leave-one-out q** | {_quantiles(family.signal[dtype])} |"
            )
    lines += [
        "",
        "bf16 relevance against float32 relevance, per (response, reward) row with a real leave-one-out context "
        f"(w at β = {BETA}):",
        "",
        "| family | bf16 path | rows | Pearson min / median | max \\|Δq\\| (float32 q there) | max \\|Δw\\| "
        "| top-10% changed | replay s (fp32 / this) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in families:
        for name, figures in family.agreement.items():
            lines.append(
                f"| {family.task} | {name} | {figures['rows']:.0f} | {figures['pearson_min']:.4f} / "
                f"{figures['pearson_median']:.4f} | {_small(figures['max_dq'])} ({figures['q_at_max_dq']:.3f}) | "
                f"{_small(figures['max_dw'])} | "
                f"{figures['top10_changed']:.0%} | {family.replay_seconds['float32']:.1f} / "
                f"{family.replay_seconds.get(name, family.replay_seconds['bf16']):.1f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="*", default=list(TASKS), choices=TASKS)
    parser.add_argument("--samples", type=int, default=4, help="responses sampled per family (one prompt)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (markdown)")
    parser.add_argument(
        "--long-starts",
        nargs="*",
        type=int,
        default=list(LONG_CONTEXT_STARTS),
        help="response start positions of the long-context bands (none: skip them)",
    )
    parser.add_argument("--long-modes", nargs="+", default=list(LONG_CONTEXT_MODES), choices=LONG_CONTEXT_MODES)
    args = parser.parse_args(argv)
    from mrtpo_verl.replay.model_loading import cast_parameters, load_causal_lm

    model32, tokenizer = load_causal_lm(None, dtype=torch.float32)
    model32.eval()
    model16 = cast_parameters(copy.deepcopy(model32), torch.bfloat16).eval()
    header = machine_description(
        "benchmarks.replay_numerics",
        sys.argv[1:] if argv is None else argv,
        f"SmolLM2-135M-Instruct ({model32.config.num_hidden_layers} layers); {args.samples} responses per family, "
        f"<= {args.max_new_tokens} tokens; ",
    )
    families = []
    for task in args.tasks:
        print(f"measuring {task} ...", file=sys.stderr, flush=True)
        families.append(measure_family(model32, model16, tokenizer, task, args.samples, args.max_new_tokens))
    long_rows = measure_long_contexts(model32, tokenizer, args.long_starts, args.long_modes)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    text = report(families, header) if families else "\n".join(["```", *header, "```", ""]) + "\n"
    if long_rows:
        text += "\n" + long_context_report(long_rows)
    print(text)
    if args.out is not None:
        args.out.write_text(f"# `python -m benchmarks.replay_numerics` — latest output\n\n{text}", encoding="utf-8")


if __name__ == "__main__":
    main()

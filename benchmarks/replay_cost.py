"""CPU benchmark of the replay's cost, every figure a ratio or fit measured side by side in one run.

Run from the repository root:

    python -m benchmarks.replay_cost              # SmolLM2-135M, 2 threads, a few minutes
    python -m benchmarks.replay_cost --quick      # tiny sizes, seconds (a smoke test, not a measurement)

It prints one Markdown table (and writes it to ``benchmarks/replay_cost_latest.md``):

- per-pass cost: the :class:`~mrtpo_verl.replay.scorer.ReplayScorer`'s time per forward pass (one full-context
  pass + K leave-one-out passes, LM head on response positions and JS reduction included, divided by 1 + K)
  against verl's old-log-prob computation on the same sequences — the model's full forward
  (``model(input_ids, attention_mask, position_ids).logits``, logits for every position) followed by
  ``verl.utils.torch_functional.logprobs_from_logits`` on the response positions. Every pass has the same
  length as the baseline's sequences (leave-one-out contexts are the full context with its last tokens
  changed), micro-batch = the baseline's batch. Target ≤ 1.2×. A decoder-only forward is timed in the same
  loop to show where the time goes;
- exact skipping on the demo's real batch (real prompts of the three task families, sampled responses,
  ``reward_fns`` scores, :class:`~mrtpo_verl.trainer.replay_stage.ReplayStage` with the in-process backend):
  fraction of passes skipped, stage time with and without skipping, relevance of needed pairs compared;
- growth: the replay stage's time (context building + scoring; GDPO's advantage step costs ~nothing, so this
  is MRTPO's extra time over GDPO) against K (synthetic ~30-token verifier texts, every pair needed) and
  against response length (256 to 4,096 tokens), each timed interleaved with verl's old-log-prob pass over
  the same responses (a cost GDPO's step pays too, quadratic attention included), with least-squares line
  fits and R²; for K also against the replayed tokens, which grow faster than K because each of the 1 + K
  contexts carries up to K verifier texts.

All timings are medians of ``--repeats``, interleaved where two things are compared; the same
``torch.set_num_threads`` is used for every figure. The machine is described at the top (on a shared machine
other processes' load shows in wall-clock times, less in the ratios).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import Row, milliseconds, time_interleaved
from benchmarks.machine import machine_description as shared_machine_description
from benchmarks.verl_reference import verl_old_log_probs
from mrtpo_verl.replay.scorer import ReplayScorer

LATEST = Path(__file__).with_name("replay_cost_latest.md")
TOKEN_RANGE = (1000, 40000)  # ordinary BPE tokens of SmolLM2's vocabulary (no special tokens)


@dataclass(frozen=True)
class SyntheticItem:
    """A response with its full and leave-one-out contexts (satisfies ``ReplayInputs``)."""

    full_context_ids: tuple[int, ...]
    leave_one_out_ids: tuple[tuple[int, ...], ...]
    response_ids: tuple[int, ...]


def machine_description(argv: list[str]) -> list[str]:
    return shared_machine_description(
        "benchmarks.replay_cost", argv, "model SmolLM2-135M-Instruct (embedded, float32); "
    )


def line_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares ``y = a + b x`` → (a, b, R²)."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return intercept, slope, 1.0 - residual / total if total else 1.0


# --- 1. per-pass cost against verl's old log-probs ------------------------------------------------------------


def synthetic_items(
    batch: int, prompt_length: int, response_length: int, num_rewards: int, seed: int
) -> list[SyntheticItem]:
    """Random-token responses whose leave-one-out contexts have the full context's length (last 16 tokens changed)."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(torch.randint(*TOKEN_RANGE, (n,), generator=generator).tolist())

    changed = min(16, prompt_length - 1)
    items = []
    for _ in range(batch):
        full = tokens(prompt_length)
        leave_one_out = tuple(full[: prompt_length - changed] + tokens(changed) for _ in range(num_rewards))
        items.append(SyntheticItem(full, leave_one_out, tokens(response_length)))
    return items


def decoder_only(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    attention_mask = torch.ones_like(input_ids)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    with torch.inference_mode():
        return model.get_decoder()(  # type: ignore[no-any-return]
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state


def per_pass_rows(
    model: Any, batch: int, prompt_length: int, response_length: int, contexts: Sequence[int], repeats: int
) -> list[Row]:
    """Scorer time per pass for each K, against verl's old-log-prob computation per sequence, in one loop."""
    items = synthetic_items(batch, prompt_length, response_length, max(contexts), seed=prompt_length)
    input_ids = torch.tensor([item.full_context_ids + item.response_ids for item in items])
    # Unshared: these rows price one forward pass (the synthetic contexts share all but their last 16 tokens).
    scorer = ReplayScorer(model, js_chunk_size=256, micro_batch_size=batch, share_prefix=False)
    functions: dict[str, Callable[[], object]] = {
        "verl": lambda: verl_old_log_probs(model, input_ids, response_length),
        "decoder": lambda: decoder_only(model, input_ids),
    }
    for k in contexts:
        needed = torch.ones(batch, k, dtype=torch.bool)
        subset = [dataclasses.replace(item, leave_one_out_ids=item.leave_one_out_ids[:k]) for item in items]
        functions[f"K={k}"] = lambda subset=subset, needed=needed: scorer.score(subset, needed)
    median = time_interleaved(functions, repeats)
    verl_per_pass = median["verl"] / batch
    setting = f"{batch} seq x ({prompt_length} prompt + {response_length} response)"
    rows = []
    for k in contexts:
        ours = median[f"K={k}"] / (batch * (1 + k))
        rows.append(
            Row(
                "replay cost per forward pass",
                f"{setting}, K={k} ({1 + k} passes/seq)",
                milliseconds(ours),
                milliseconds(verl_per_pass),
                "verl old log-probs (full logits + logprobs_from_logits) per seq",
                f"{ours / verl_per_pass:.2f}x",
            )
        )
    decoder = median["decoder"] / batch
    rows.append(
        Row(
            "  where the time goes",
            f"{setting}, decoder only (no LM head)",
            milliseconds(decoder),
            milliseconds(verl_per_pass),
            "verl old log-probs per seq",
            f"{decoder / verl_per_pass:.2f}x (LM head + log-probs: {1 - decoder / verl_per_pass:.0%} of verl)",
        )
    )
    return rows


# --- 2. exact skipping on the demo's real batch ----------------------------------------------------------------


def demo_batch(model: Any, tokenizer: Any, samples: int, max_new_tokens: int, seed: int) -> tuple[Any, Any]:
    """The demo's batch without Ray: 1 real prompt per task family, sampled and scored → (DataProto, MRTPOConfig)."""
    from mrtpo_verl.config import MRTPOConfig, ReplayConfig
    from mrtpo_verl.demo.batch import pack_batch, sample_group
    from mrtpo_verl.demo.tasks import TASKS, load_prompts
    from reward_fns import dispatch

    torch.manual_seed(seed)
    families = list(TASKS)
    reward_keys = dispatch.reward_keys(families)
    cfg = MRTPOConfig(
        reward_keys=reward_keys,
        verifier_info_keys=tuple(dispatch.info_key(k) for k in reward_keys),
        replay=ReplayConfig(temperature=0.8, micro_batch_size=4),
    )
    prompts = [p for task in families for p in load_prompts(task, 1)]
    responses = []
    for index, prompt in enumerate(prompts):
        responses += sample_group(model, tokenizer, prompt, index, samples, max_new_tokens, 0.8, True, families)
    return pack_batch(responses, prompts, reward_keys, tokenizer.pad_token_id), cfg


def skipping_rows(model: Any, tokenizer: Any, samples: int, max_new_tokens: int, repeats: int) -> list[Row]:
    from mrtpo_verl.trainer.replay_stage import ReplayStage
    from mrtpo_verl.workers.placement import InProcessBackend

    data, cfg = demo_batch(model, tokenizer, samples, max_new_tokens, seed=0)
    stages = {}
    for skip in (True, False):
        with_skip = dataclasses.replace(cfg, replay=dataclasses.replace(cfg.replay, skip_zero_advantage=skip))
        stages[skip] = ReplayStage(with_skip, None, InProcessBackend(with_skip, model, tokenizer))
    results: dict[bool, tuple[torch.Tensor, dict[str, float]]] = {}

    def run(skip: bool) -> None:
        results[skip] = stages[skip].run(data, global_step=10)

    median = time_interleaved({"skip": lambda: run(True), "all": lambda: run(False)}, repeats, warm_up=False)
    needed = stages[True].needed_pairs(data)
    (relevance_skip, metrics_skip), (relevance_all, metrics_all) = results[True], results[False]
    difference = float((relevance_skip - relevance_all)[needed].abs().max()) if needed.any() else 0.0
    skipped_zero = bool((relevance_skip[~needed] == 0).all())
    bs, k = needed.shape
    setting = f"demo batch: {bs} responses (3 tasks x {samples} samples + refs, {max_new_tokens} new tokens), K={k}"
    same = "identical" if difference == 0.0 else f"max |diff| {difference:.1e}"
    return [
        Row(
            "exact skipping (demo batch)",
            setting,
            f"{metrics_skip['mrtpo/replay/forward_passes']:.0f} passes, "
            f"{metrics_skip['mrtpo/replay/skip_fraction']:.0%} skipped",
            f"{metrics_all['mrtpo/replay/forward_passes']:.0f} passes, "
            f"{metrics_all['mrtpo/replay/skip_fraction']:.0%} skipped",
            "skip_zero_advantage=false",
            f"{metrics_skip['mrtpo/replay/forward_passes'] / metrics_all['mrtpo/replay/forward_passes']:.2f}x passes",
        ),
        Row(
            "  stage time",
            f"{setting}; q on {int(needed.sum())} needed pairs {same}, skipped pairs q=0: {skipped_zero}",
            milliseconds(median["skip"]),
            milliseconds(median["all"]),
            "skip_zero_advantage=false",
            f"{median['skip'] / median['all']:.2f}x",
        ),
    ]


# --- 3. growth with K and response length ----------------------------------------------------------------------


def verifier_text(k: int, generator: torch.Generator) -> str:
    words = ["row", "count", "expected", "got", "column", "mismatch", "table", "value", "error", "passed"]
    picks = torch.randint(len(words), (24,), generator=generator).tolist()
    return f"check {k}: " + " ".join(words[i] for i in picks) + "."


def growth_batch(
    tokenizer: Any, batch: int, response_length: int, num_rewards: int, seed: int
) -> tuple[list[list[dict[str, str]]], list[list[int]], list[list[str]]]:
    generator = torch.Generator().manual_seed(seed)
    prompt = "Write a SQLite query that lists the names of all singers older than 30, ordered by age."
    prompts = [[{"role": "user", "content": prompt}] for _ in range(batch)]
    responses = [torch.randint(*TOKEN_RANGE, (response_length,), generator=generator).tolist() for _ in range(batch)]
    infos = [[verifier_text(k, generator) for k in range(num_rewards)] for _ in range(batch)]
    return prompts, responses, infos


@dataclasses.dataclass(frozen=True)
class GrowthPoint:
    """One growth measurement: replay stage and verl's old-log-prob pass on the same responses, interleaved."""

    replay_s: float
    old_log_prob_s: float
    replayed_tokens: int


def growth_point(model: Any, tokenizer: Any, batch: int, response_length: int, k: int, repeats: int) -> GrowthPoint:
    """Median seconds of the replay stage (context building + scoring, every pair needed) and of verl's
    old-log-prob computation over the same responses after their full contexts (what GDPO's step also pays)."""
    from mrtpo_verl.replay.contexts import ReplayContextBuilder

    builder = ReplayContextBuilder(tokenizer, [f"reward_{i}" for i in range(k)], max_context_tokens=8192)
    # Unshared: the growth of the method's own cost, (1 + K) contexts each replayed in full.
    scorer = ReplayScorer(model, js_chunk_size=256, micro_batch_size=4, share_prefix=False)
    prompts, responses, infos = growth_batch(tokenizer, batch, response_length, k, seed=k * 10_000 + response_length)
    needed = torch.ones(batch, k, dtype=torch.bool)
    sequences = [
        torch.tensor([[*item.full_context_ids, *item.response_ids]])
        for item in builder.build_batch(prompts, responses, infos)
    ]
    replayed: list[int] = []

    def stage() -> None:
        replayed.append(scorer.score(builder.build_batch(prompts, responses, infos), needed).stats.replayed_tokens)

    def old_log_probs() -> None:
        for input_ids in sequences:
            verl_old_log_probs(model, input_ids, response_length)

    median = time_interleaved({"stage": stage, "verl": old_log_probs}, repeats, warm_up=False)
    return GrowthPoint(median["stage"], median["verl"], replayed[-1])


def growth_rows(
    model: Any,
    tokenizer: Any,
    batch: int,
    contexts: Sequence[int],
    lengths: Sequence[int],
    k_for_lengths: int,
    length_for_k: int,
    repeats: int,
) -> list[Row]:
    rows = []
    by_k = {k: growth_point(model, tokenizer, batch, length_for_k, k, repeats) for k in contexts}
    for k, point in by_k.items():
        rows.append(
            Row(
                "growth with K",
                f"{batch} responses x {length_for_k} tokens, K={k} (~30-token verifier texts): "
                f"{point.replayed_tokens:,} tokens replayed",
                milliseconds(point.replay_s),
                milliseconds(point.old_log_prob_s),
                "verl old log-probs, same responses",
                f"{point.replay_s / point.old_log_prob_s:.2f}x; "
                f"{point.replay_s / point.replayed_tokens * 1e3:.2f} ms per replayed token",
            )
        )
    ks = list(by_k)
    rows.append(fit_row("  line fit time vs K", ks, [by_k[k].replay_s for k in ks], "s per extra reward"))
    tokens = [by_k[k].replayed_tokens for k in ks]
    rows.append(
        fit_row("  line fit time vs tokens", tokens, [by_k[k].replay_s for k in ks], "s per 1k replayed tokens", 1e3)
    )
    by_length = {n: growth_point(model, tokenizer, batch, n, k_for_lengths, repeats) for n in lengths}
    for n, point in by_length.items():
        rows.append(
            Row(
                "growth with response length",
                f"{batch} responses x {n} tokens, K={k_for_lengths}",
                milliseconds(point.replay_s),
                milliseconds(point.old_log_prob_s),
                "verl old log-probs, same responses",
                f"{point.replay_s / point.old_log_prob_s:.2f}x ({1 + k_for_lengths} passes)",
            )
        )
    ns = list(by_length)
    rows.append(fit_row("  line fit time vs length", ns, [by_length[n].replay_s for n in ns], "s per 1k tokens", 1e3))
    # The model's own attention is quadratic in the sequence length: verl's pass bends the same way.
    old_log_prob_times = [by_length[n].old_log_prob_s for n in ns]
    rows.append(fit_row("  same fit, verl old log-probs", ns, old_log_prob_times, "s per 1k tokens", 1e3))
    ratios = [by_length[n].replay_s / by_length[n].old_log_prob_s for n in ns]
    rows.append(
        Row(
            "  replay / old log-probs",
            f"x = {', '.join(map(str, ns))}",
            f"{min(ratios):.2f}x - {max(ratios):.2f}x",
            "",
            "spread over lengths",
            f"max / min = {max(ratios) / min(ratios):.2f} (1.00: grows exactly as verl's own pass)",
        )
    )
    return rows


def fit_row(name: str, xs: list[int], ys: list[float], unit: str, scale: float = 1.0) -> Row:
    intercept, slope, r2 = line_fit([float(x) for x in xs], ys)
    # Super-linear: the largest point above the line through the others by more than 10% of its value.
    head_a, head_b, _ = line_fit([float(x) for x in xs[:-1]], ys[:-1]) if len(xs) > 2 else (intercept, slope, 1.0)
    excess = ys[-1] / (head_a + head_b * xs[-1]) - 1 if head_a + head_b * xs[-1] > 0 else 0.0
    verdict = f"super-linear: largest point {excess:+.0%} above the line of the others" if excess > 0.10 else "linear"
    return Row(
        name,
        f"x = {', '.join(map(str, xs))}; largest point vs line of the others {excess:+.0%}",
        f"{slope * scale:.3f} {unit}",
        f"{intercept:.3f} s",
        "intercept",
        f"R² = {r2:.4f} ({verdict})",
    )


# --- table -----------------------------------------------------------------------------------------------------


def table_lines(rows: list[Row]) -> list[str]:
    header = Row("measurement", "setting", "ours", "baseline", "baseline is", "ours / baseline")
    widths = [max(len(getattr(r, f)) for r in [header, *rows]) for f in Row.__dataclass_fields__]

    def line(row: Row) -> str:
        cells = [getattr(row, f).ljust(w) for f, w in zip(Row.__dataclass_fields__, widths, strict=True)]
        return "| " + " | ".join(cells) + " |"

    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(row) for row in rows)]


def parse_setting(text: str) -> tuple[int, int, int]:
    """``"4x128+128"`` → (batch, prompt length, response length)."""
    match = re.fullmatch(r"(\d+)x(\d+)\+(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected BATCHxPROMPT+RESPONSE, e.g. 4x128+128; got {text!r}")
    batch, prompt, response = (int(group) for group in match.groups())
    return batch, prompt, response


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads for every figure (1: shared 2 cores)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per per-pass figure (median)")
    parser.add_argument("--stage-repeats", type=int, default=1, help="repeats of the demo and growth stage timings")
    parser.add_argument("--settings", type=parse_setting, nargs="+", default=[(2, 128, 128)])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1, 2], help="K for the per-pass rows")
    parser.add_argument("--growth-contexts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--growth-lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--growth-batch", type=int, default=1, help="responses per growth batch")
    parser.add_argument("--growth-k-length", type=int, default=128, help="response length of the K sweep")
    parser.add_argument("--growth-length-k", type=int, default=1, help="K of the response-length sweep")
    parser.add_argument("--samples", type=int, default=3, help="demo batch: samples per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="demo batch: new tokens per sample")
    parser.add_argument("--no-demo", action="store_true", help="skip the demo-batch rows")
    parser.add_argument("--family-samples", type=int, default=8, help="task-family rows: responses per prompt (n)")
    parser.add_argument("--family-new-tokens", type=int, default=48, help="task-family rows: new tokens per response")
    parser.add_argument("--family-repeats", type=int, default=1, help="task-family rows: timed repeats (median)")
    parser.add_argument("--only-families", action="store_true", help="only the task-family (prefix sharing) rows")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, not a measurement")
    parser.add_argument("--out", default=str(LATEST), help="where to write the Markdown ('' = nowhere)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats, args.settings, args.contexts = 1, [(2, 16, 16)], [1]
        args.growth_contexts, args.growth_lengths, args.samples, args.max_new_tokens = [1, 2], [16, 32], 2, 4
        args.family_samples, args.family_new_tokens = 2, 4
    started = time.perf_counter()
    header = machine_description(sys.argv[1:] if argv is None else argv)
    for text in header:
        print(text)
    print(flush=True)

    from mrtpo_verl.replay.model_loading import load_causal_lm

    model, tokenizer = load_causal_lm(None)
    from benchmarks.replay_families import family_rows
    from mrtpo_verl.demo.tasks import TASKS

    rows: list[Row] = family_rows(
        model, tokenizer, list(TASKS), args.family_samples, args.family_new_tokens, args.family_repeats
    )
    if args.only_families:
        return _report(rows, header, started, args.out)
    for batch, prompt_length, response_length in args.settings:
        rows += per_pass_rows(model, batch, prompt_length, response_length, args.contexts, args.repeats)
    if not args.no_demo:
        rows += skipping_rows(model, tokenizer, args.samples, args.max_new_tokens, args.stage_repeats)
    rows += growth_rows(
        model,
        tokenizer,
        args.growth_batch,
        args.growth_contexts,
        args.growth_lengths,
        k_for_lengths=args.growth_length_k,
        length_for_k=min(args.growth_k_length, max(args.growth_lengths)),
        repeats=args.stage_repeats,
    )
    return _report(rows, header, started, args.out)


def _report(rows: list[Row], header: list[str], started: float, out: str) -> list[Row]:
    lines = [*table_lines(rows), "", f"total runtime {time.perf_counter() - started:.0f} s"]
    print("\n".join(lines), flush=True)
    if out:  # a str: Path("") would be "." and always true
        Path(out).write_text("\n".join([*header, "", *lines]) + "\n", encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()

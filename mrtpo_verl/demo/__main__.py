"""``python -m mrtpo_verl.demo``: one MRTPO credit-assignment step on real prompts, on CPU.

1. sample a few responses per real prompt of each task family with the policy (default: the
   embedded SmolLM2-135M-Instruct; ``--model-path`` takes any local HF model directory);
2. score them with ``reward_fns`` (rewards and verifier information);
3. replay them on a Ray replay worker group (verl ``RayWorkerGroup``, one CPU worker);
4. compute ``gdpo`` and ``mrtpo`` advantages through verl's own ``compute_advantage``;
5. write ``summary.md`` / ``summary.json`` (rewards, relevance concentration, replay time),
   ``token_credit.html`` (each response's tokens shaded by each reward's credit, GDPO | MRTPO)
   and ``views.jsonl`` (what the page shows, for ``python -m mrtpo_verl.credit.render``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import ray
import torch
from rich.console import Console
from rich.table import Table

from mrtpo_verl.config import CPU_REPLAY_BUDGETS, MRTPOConfig, ReplayConfig
from mrtpo_verl.credit.html_page import render_page
from mrtpo_verl.credit.token_credit import token_credit
from mrtpo_verl.credit.views import views_from_batch, write_views
from mrtpo_verl.demo.batch import pack_batch, sample_group
from mrtpo_verl.demo.tasks import TASKS, load_prompts
from mrtpo_verl.replay.model_loading import load_causal_lm
from mrtpo_verl.trainer.replay_stage import ReplayStage
from mrtpo_verl.workers.placement import DedicatedBackend, create_replay_worker_group
from reward_fns import dispatch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mrtpo_verl.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-path", default=None, help="local HF model dir (default: embedded SmolLM2-135M)")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--prompts-per-task", type=int, default=1)
    parser.add_argument("--samples", type=int, default=3, help="sampled responses per prompt (group size)")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--no-reference", action="store_true", help="do not add the reference answer to a group")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("demo_out"))
    args = parser.parse_args(argv)
    if args.samples < 1 or args.prompts_per_task < 1 or args.max_new_tokens < 1:
        parser.error("--samples, --prompts-per-task and --max-new-tokens must be ≥ 1")
    if args.samples < 2 and args.no_reference:
        parser.error("a group needs ≥ 2 responses: use --samples ≥ 2 or keep the reference answer")
    if not args.temperature > 0:
        parser.error("--temperature must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    families = list(args.tasks)
    reward_keys = dispatch.reward_keys(families)
    cfg = MRTPOConfig(
        reward_keys=reward_keys,
        verifier_info_keys=tuple(dispatch.info_key(k) for k in reward_keys),
        # The demo runs on the CPU: small replay calls (the package defaults are sized for a GPU).
        replay=ReplayConfig(
            temperature=args.temperature, micro_batch_size=4, max_tokens_per_micro_batch=CPU_REPLAY_BUDGETS[1]
        ),
    )
    step = cfg.warmup_steps  # the end of the warm-up: β_s = β

    with console.status("loading the policy model…"):
        model, tokenizer = load_causal_lm(args.model_path)
    prompts = [p for task in families for p in load_prompts(task, args.prompts_per_task)]
    responses = []
    for index, prompt in enumerate(prompts):
        with console.status(
            f"sampling {args.samples} responses for prompt {index + 1}/{len(prompts)} ({prompt.task})…"
        ):
            responses += sample_group(
                model,
                tokenizer,
                prompt,
                index,
                args.samples,
                args.max_new_tokens,
                args.temperature,
                not args.no_reference,
                families,
            )
    data = pack_batch(responses, prompts, reward_keys, tokenizer.pad_token_id)
    console.print(f"[green]✓[/green] {len(data)} responses to {len(prompts)} prompts, scored by reward_fns")

    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False)
    try:
        with console.status("starting the replay worker group (Ray, CPU) and loading the model there…"):
            group = create_replay_worker_group(cfg, args.model_path, [1], "cpu", cpus_per_worker=os.cpu_count() or 2)
        with console.status("replaying the full and leave-one-out contexts…"):
            relevance, metrics = ReplayStage(cfg, None, DedicatedBackend(group)).run(data, global_step=step)
    finally:
        ray.shutdown()
    credit = token_credit(data, relevance, cfg, step)

    args.out.mkdir(parents=True, exist_ok=True)
    labels = [f"{prompts[r.prompt_index].task} · {r.label}" for r in responses]
    views = views_from_batch(data, credit, tokenizer, reward_keys, cfg.verifier_info_keys, labels)
    meta = {
        "model": args.model_path or "SmolLM2-135M-Instruct (embedded)",
        "β_s": credit.beta,
        "replay time (s)": round(metrics["mrtpo/replay/time_s"], 1),
        "passes skipped": f"{metrics['mrtpo/replay/skip_fraction']:.0%}",
    }
    write_views(args.out / "views.jsonl", views, meta)
    (args.out / "token_credit.html").write_text(render_page("MRTPO vs GDPO token credit", views, reward_keys, meta))
    summary = _summary(data, responses, prompts, reward_keys, metrics)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.out / "summary.md").write_text(_markdown(summary))
    _print_summary(console, summary)
    console.print(
        f"wrote {args.out / 'token_credit.html'} and summary.md/json, views.jsonl "
        f"in {time.perf_counter() - started:.0f} s"
    )
    return 0


def _summary(data, responses, prompts, reward_keys, metrics) -> dict:
    tasks: dict[str, dict] = {}
    for task in dict.fromkeys(p.task for p in prompts):
        rows = [r for r in responses if prompts[r.prompt_index].task == task]
        own = [k for k in reward_keys if rows and rows[0].scores.get(dispatch.info_key(k))]
        tasks[task] = {
            "responses": len(rows),
            "mean_reward": {k: sum(r.scores[k] for r in rows) / len(rows) for k in own},
        }
    per_reward = {
        k: {
            name: metrics[f"mrtpo/{k}/{name}"]
            for name in ("relevance_mean", "relevance_top10_share")
            if f"mrtpo/{k}/{name}" in metrics
        }
        for k in reward_keys
    }
    replay = {k.removeprefix("mrtpo/replay/"): v for k, v in metrics.items() if k.startswith("mrtpo/replay/")}
    return {"tasks": tasks, "relevance": per_reward, "replay": replay}


def _markdown(summary: dict) -> str:
    lines = ["| task | responses | mean rewards |", "|---|---:|---|"]
    for task, row in summary["tasks"].items():
        rewards = ", ".join(f"{k} {v:.2f}" for k, v in row["mean_reward"].items())
        lines.append(f"| {task} | {row['responses']} | {rewards} |")
    lines += ["", "| reward | mean relevance | top-10% share (uniform 0.10) |", "|---|---:|---:|"]
    for key, row in summary["relevance"].items():
        if row:
            lines.append(
                f"| {key} | {row['relevance_mean']:.4f} | {row.get('relevance_top10_share', float('nan')):.2f} |"
            )
    replay = summary["replay"]
    lines += [
        "",
        f"Replay: {replay['time_s']:.1f} s, {replay['forward_passes']:.0f} forward passes, "
        f"{replay['skip_fraction']:.0%} of passes skipped exactly, {replay['tokens_per_s']:.0f} tokens/s.",
    ]
    return "\n".join(lines) + "\n"


def _print_summary(console: Console, summary: dict) -> None:
    table = Table(title="rewards")
    for column in ("task", "responses", "mean rewards"):
        table.add_column(column)
    for task, row in summary["tasks"].items():
        table.add_row(task, str(row["responses"]), ", ".join(f"{k} {v:.2f}" for k, v in row["mean_reward"].items()))
    console.print(table)
    relevance = Table(title="relevance concentration (replayed pairs)")
    for column in ("reward", "mean q", "top-10% share (uniform 0.10)"):
        relevance.add_column(column)
    for key, row in summary["relevance"].items():
        if row:
            relevance.add_row(
                key, f"{row['relevance_mean']:.4f}", f"{row.get('relevance_top10_share', float('nan')):.2f}"
            )
    console.print(relevance)
    replay = summary["replay"]
    console.print(
        f"replay: {replay['time_s']:.1f} s, {replay['forward_passes']:.0f} forward passes, "
        f"{replay['skip_fraction']:.0%} skipped exactly, {replay['tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m benchmarks.learning``: train every arm on verl's trainer, seed by seed, and report.

The plan is round-robin: for each seed, one run of every arm, the arms' order rotated from seed to
seed (so no arm always runs first, right after start-up, or last on a busy machine). Every run is
its own ``python -m mrtpo_verl.main_ppo`` process; after each finished run the records and the
report are rewritten, so an interrupted comparison has a report of what finished. Running the same
command again skips finished runs and resumes an interrupted one from verl's last checkpoint
(``benchmarks.learning.runner``). ``plan.json`` in the output folder holds the settings; a second
command with different settings (other than seeds, arms and the time budget, which extend the plan)
stops with the differing fields named instead of mixing runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.learning.arms import ARMS, check_arms
from benchmarks.learning.overrides import GPU_ROLLOUTS, run_env, run_overrides
from benchmarks.learning.presets import PRESETS, Preset, preset
from benchmarks.learning.records import step_records
from benchmarks.learning.report import Comparison, write_report
from benchmarks.learning.runner import RunFailed, finish_run, read_records, run_dir, run_is_done, run_trainer
from benchmarks.learning.tasks import DEMO_TASKS, RECIPE_FAMILIES, Task, build_demo_task, recipe_task
from benchmarks.machine import machine_description

__all__ = ["interleaved_plan", "main"]

REPO = Path(__file__).resolve().parents[2]
#: Settings that may change between two commands on one output folder (they only extend or cut the plan).
EXTENDABLE = {"seeds", "arms", "time_budget_s", "run_timeout_s"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.learning", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu", choices=list(PRESETS), help="sizes (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: learning_out/<preset>)")
    parser.add_argument("--arms", nargs="+", default=None, help=f"arms among {list(ARMS)} (preset's by default)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (preset's by default)")
    sizes = parser.add_argument_group("sizes (override the preset)")
    for name, kind in (
        ("steps", int),
        ("test-freq", int),
        ("save-freq", int),
        ("batch-size", int),
        ("n", int),
        ("response-length", int),
        ("train-prompts", int),
        ("val-prompts", int),
        ("lr", float),
        ("kl-coef", float),
        ("warmup-steps", int),
        ("time-budget-s", float),
        ("run-timeout-s", float),
        ("gpu-memory-utilization", float),
    ):
        sizes.add_argument(f"--{name}", type=kind, default=None)
    sizes.add_argument("--rollout", default=None, help="hf (cpu) | vllm | sglang (gpu)")
    sizes.add_argument("--override", action="append", default=[], help="one more hydra override for every run")
    data = parser.add_argument_group("task (default: the preset's built demo task)")
    data.add_argument("--task", choices=list(DEMO_TASKS), default=None, help="the built demo task (without --recipe)")
    data.add_argument("--recipe", choices=list(RECIPE_FAMILIES), default=None, help="a recipe's data and rewards")
    data.add_argument("--data-dir", type=Path, default=None, help="the recipe's prepared data (train/test.parquet)")
    data.add_argument("--train-file", type=Path, default=None)
    data.add_argument("--val-file", type=Path, default=None)
    data.add_argument("--reward-keys", nargs="+", default=None, help="compare these of the family's rewards")
    data.add_argument("--max-constraints", type=int, default=3, help="instruction following's reward slots")
    data.add_argument("--model-path", type=Path, default=None, help="local HF model folder (default: SmolLM2)")
    out = parser.add_argument_group("report")
    out.add_argument("--report", type=Path, default=None, help="markdown report (default: <out>/report.md)")
    out.add_argument("--threshold", action="append", default=[], help="KEY=VALUE: steps-to-threshold level")
    parser.add_argument("--dry-run", action="store_true", help="compose and check every arm's config; start nothing")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report from finished runs")
    args = parser.parse_args(argv)
    try:
        args.thresholds = {key: float(value) for key, _, value in (item.partition("=") for item in args.threshold)}
    except ValueError:
        parser.error(f"--threshold takes KEY=VALUE with a number, got {args.threshold}")
    return args


def settings(args: argparse.Namespace) -> Preset:
    try:
        arms = check_arms(args.arms) if args.arms else None
    except ValueError as error:
        raise SystemExit(f"error: --arms: {error}") from None
    chosen = preset(args.preset).with_options(
        steps=args.steps,
        test_freq=args.test_freq,
        save_freq=args.save_freq,
        batch_size=args.batch_size,
        n=args.n,
        response_length=args.response_length,
        train_prompts=args.train_prompts,
        val_prompts=args.val_prompts,
        lr=args.lr,
        kl_coef=args.kl_coef,
        warmup_steps=args.warmup_steps,
        time_budget_s=args.time_budget_s,
        run_timeout_s=args.run_timeout_s,
        gpu_memory_utilization=args.gpu_memory_utilization,
        rollout=args.rollout,
        task=args.task,
        seeds=tuple(args.seeds) if args.seeds else None,
        arms=arms,
        extra=(*preset(args.preset).extra, *args.override) if args.override else None,
    )
    problems = [
        f"--{name.replace('_', '-')} must be at least {low}, got {getattr(chosen, name)}"
        for name, low in (
            ("steps", 1),
            ("batch_size", 1),
            ("n", 2),
            ("response_length", 1),
            ("train_prompts", 1),
            ("val_prompts", 1),
        )
        if getattr(chosen, name) < low
    ]
    if chosen.test_freq < 1:
        problems.append(f"--test-freq must be at least 1 (evaluation is the point), got {chosen.test_freq}")
    rollouts = ("hf",) if chosen.device == "cpu" else GPU_ROLLOUTS
    if chosen.rollout not in rollouts:
        allowed = " | ".join(rollouts)
        problems.append(f"--rollout {chosen.rollout!r} with the {chosen.device} preset (allowed: {allowed})")
    if len(set(chosen.seeds)) != len(chosen.seeds):
        problems.append(f"--seeds repeats a seed: {list(chosen.seeds)}")
    if problems:
        raise SystemExit("error: " + "; ".join(problems))
    return chosen


def interleaved_plan(arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """Seed by seed, every arm once, the arms' order rotated by one position per seed."""
    plan = []
    for index, seed in enumerate(seeds):
        shift = index % len(arms)
        plan.extend((arm, seed) for arm in [*arms[shift:], *arms[:shift]])
    return plan


def model_folder(args: argparse.Namespace, chosen: Preset, out: Path) -> Path:
    """``--model-path``, or where the embedded SmolLM2 (cut to the preset's layers) is saved."""
    if args.model_path is not None:
        return args.model_path.resolve()
    return out / ("model" if chosen.model_layers is None else f"model_{chosen.model_layers}_layers")


def prepare_model(args: argparse.Namespace, chosen: Preset, out: Path) -> Path:
    folder = model_folder(args, chosen, out)
    if args.model_path is not None:
        if not (folder / "config.json").is_file():
            raise SystemExit(f"error: --model-path {args.model_path}: no config.json (a local HF model folder)")
        return folder
    from mrtpo_cpu.launch import save_derived_model

    if not (folder / "config.json").is_file():
        save_derived_model(folder, num_layers=chosen.model_layers)
    return folder


def prepare_task(args: argparse.Namespace, chosen: Preset, out: Path, model: Path) -> Task:
    if args.recipe is None:
        if args.train_file or args.val_file or args.data_dir or args.reward_keys:
            raise SystemExit(
                "error: --train-file/--val-file/--data-dir/--reward-keys need --recipe (the reward family)"
            )
        try:
            return build_demo_task(out / "task", model, chosen.train_prompts, chosen.val_prompts, chosen.task)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
    if args.task is not None:
        raise SystemExit("error: --task names a built demo task; --recipe trains on the recipe's data instead")
    data_dir = args.data_dir or Path.home() / "data" / "mrtpo" / args.recipe
    try:
        return recipe_task(
            args.recipe,
            (args.train_file or data_dir / "train.parquet").resolve(),
            (args.val_file or data_dir / "test.parquet").resolve(),
            model,
            out / "task",
            chosen.val_prompts,
            args.max_constraints,
            args.reward_keys,
        )
    except (FileNotFoundError, ValueError, KeyError) as error:  # KeyError: a column the task reads is missing
        raise SystemExit(f"error: {error}") from None


def as_stored(value: Any) -> Any:
    """``value`` as ``plan.json`` gives it back (tuples as lists, paths as text)."""
    return json.loads(json.dumps(value, default=str))


def check_plan_file(out: Path, section: str, value: dict[str, Any]) -> None:
    """Stop when ``plan.json`` holds another ``section`` (``settings`` or ``task``; ``EXTENDABLE`` may differ)."""
    path = out / "plan.json"
    if not path.is_file():
        return
    old = json.loads(path.read_text()).get(section, {})
    value = as_stored(value)
    differing = sorted(
        f"{name}: {old.get(name)!r} -> {new!r}"
        for name, new in value.items()
        if name not in EXTENDABLE and old.get(name) != new
    )
    if differing:
        raise SystemExit(
            f"error: {out} holds a comparison with other {section} ({'; '.join(differing)}); "
            "use another --out, or the same settings to resume"
        )


def dry_run(chosen: Preset, task: Task, model: Path, out: Path) -> None:
    """Compose and check every arm's config through ``python -m mrtpo_verl.main_ppo ... mrtpo.dry_run=true``."""
    for arm in chosen.arms:
        seed = chosen.seeds[0]
        overrides = run_overrides(chosen, task, model, run_dir(out, arm, seed), arm, seed)
        result = subprocess.run(
            [sys.executable, "-m", "mrtpo_verl.main_ppo", *overrides, "mrtpo.dry_run=true"],
            env={**os.environ, **run_env(chosen)},
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        last = (result.stdout.strip().splitlines() or [""])[-1]
        if result.returncode != 0 or "config valid" not in last:
            raise SystemExit(
                f"error: dry run of arm {arm} failed (status {result.returncode}):\n{result.stderr[-3000:]}"
            )
        print(f"  {arm}: {last}", flush=True)


def collect(out: Path, plan: Sequence[tuple[str, int]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    folders = {(arm, seed): run_dir(out, arm, seed) for arm, seed in plan}
    return {run: read_records(folder) for run, folder in folders.items() if run_is_done(folder)}


def report(
    out: Path, report_path: Path, chosen: Preset, task: Task, plan: Sequence[tuple[str, int]], args: argparse.Namespace
) -> None:
    runs = collect(out, plan)
    header = [
        f"# `python -m benchmarks.learning` — {chosen.name} preset",
        "",
        "```",
        *machine_description("benchmarks.learning", list(args.argv)),
        f"task: {task.name}; rewards {', '.join(task.reward_keys)}; prompts <= {task.prompt_length} tokens; "
        f"evaluation: {sum(task.val_sources.values())} held-out prompts, greedy",
        f"settings: {chosen.batch_size} prompts x n={chosen.n} per step, responses <= {chosen.response_length} "
        f"tokens, {chosen.steps} steps, lr {chosen.lr}, KL coef {chosen.kl_coef}, MRTPO warm-up "
        f"{chosen.warmup_steps} steps, evaluation every {chosen.test_freq} steps, rollout {chosen.rollout} "
        f"({chosen.device})",
        f"plan (round-robin): {', '.join(f'{arm}/s{seed}' for arm, seed in plan)}",
        "```",
    ]
    status = [f"Finished runs: {len(runs)} of {len(plan)}" + ("" if len(runs) == len(plan) else " (resumable)")]
    write_report(Comparison(runs, task.reward_keys, chosen.arms), report_path, header, args.thresholds, status)


def stop_on_sigterm(signum: int, frame: Any) -> None:
    """``kill`` stops the comparison like Ctrl-C: the running trainer's process group is ended too."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    args = parse_args(argv)
    try:  # the report's plots: fail now, not after the first hour of training
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("error: benchmarks.learning draws its plots with matplotlib: pip install matplotlib") from None
    args.argv = list(sys.argv[1:] if argv is None else argv)
    chosen = settings(args)
    out = (args.out or REPO / "learning_out" / chosen.name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report_path = (args.report or out / "report.md").resolve()
    print(f"benchmarks.learning: preset {chosen.name}, output {out}", flush=True)
    settings_record = {**asdict(chosen), "model": str(model_folder(args, chosen, out))}
    check_plan_file(out, "settings", settings_record)  # before any preparation: a mistake stops at once
    model = prepare_model(args, chosen, out)
    task = prepare_task(args, chosen, out, model)
    check_plan_file(out, "task", task.describe())
    unknown_thresholds = sorted(set(args.thresholds) - set(task.reward_keys))
    if unknown_thresholds:
        rewards = list(task.reward_keys)
        raise SystemExit(f"error: --threshold for {unknown_thresholds}: the task's rewards are {rewards}")
    plan_record = as_stored({"settings": settings_record, "task": task.describe()})
    (out / "plan.json").write_text(json.dumps(plan_record, indent=1))
    plan = interleaved_plan(chosen.arms, chosen.seeds)
    print(f"task {task.name}: rewards {list(task.reward_keys)}, prompts <= {task.prompt_length} tokens", flush=True)
    if args.dry_run:
        dry_run(chosen, task, model, out)
        return
    if not args.report_only:
        try:
            run_plan(out, report_path, chosen, task, model, plan, args)
        except RunFailed as failed:
            raise SystemExit(f"error: {failed}") from None
    report(out, report_path, chosen, task, plan, args)
    print(f"report: {report_path}", flush=True)


def run_plan(
    out: Path,
    report_path: Path,
    chosen: Preset,
    task: Task,
    model: Path,
    plan: Sequence[tuple[str, int]],
    args: argparse.Namespace,
) -> None:
    started = time.monotonic()
    durations: list[float] = []
    for index, (arm, seed) in enumerate(plan):
        folder = run_dir(out, arm, seed)
        label = f"[{index + 1}/{len(plan)}] {arm} seed {seed}"
        if run_is_done(folder):
            print(f"{label}: finished before, kept", flush=True)
            continue
        elapsed = time.monotonic() - started
        expected = max(durations) if durations else 0.0
        if elapsed + expected > chosen.time_budget_s:
            print(
                f"{label}: not started, time budget {chosen.time_budget_s:.0f} s ({elapsed:.0f} s used, a run "
                f"took up to {expected:.0f} s); the same command resumes",
                flush=True,
            )
            break
        print(f"{label}: running ({folder})", flush=True)
        run_started = time.monotonic()
        metrics = run_trainer(
            folder,
            run_overrides(chosen, task, model, folder, arm, seed),
            run_env(chosen),
            chosen.steps,
            chosen.run_timeout_s,
        )
        durations.append(time.monotonic() - run_started)
        finish_run(folder, step_records(metrics, task.reward_keys, task.val_sources, arm, seed))
        report(out, report_path, chosen, task, plan, args)

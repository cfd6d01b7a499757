"""MRTPO's price on verl's real trainer: step time of ``mrtpo`` over ``gdpo``, replay shared and unshared.

Every run is ``python -m mrtpo_verl.main_ppo`` on the CPU backend (:mod:`mrtpo_cpu`:
verl 0.9.1's v1 trainer, FSDP2 on gloo, the ``hf`` rollout) with the full SmolLM2-135M-Instruct,
the shortest text-to-SQL prompts of the bundled Spider subset (schema + question,
``recipes/data/prepare_text_to_sql.py``) and ``rollout.n`` responses each, scored by our
text-to-SQL verifier. Three configurations, run in turn and repeated (``--rounds``) so that the
machine's load hits all alike: ``gdpo``; ``mrtpo`` with ``mrtpo.replay.share_prefix=true``;
``mrtpo`` with ``share_prefix=false``. Each run is its own process and Ray cluster, so steps can
only be interleaved run by run. The first step of a run includes warm-up (allocator, first
generate, first replay): it is reported separately, the table's medians are over the later steps.

Figures per configuration: median ``timing_s/step`` (verl), the replay stage's median
``mrtpo/replay/time_s`` (ours) and its share of the step, replayed tokens and shared prefix
tokens, and step time / GDPO's step time.

Example::

    python -m benchmarks.step_overhead            # 3 prompts x n=4, 48 tokens, 3 steps, 1 round
    python -m benchmarks.step_overhead --quick    # 2 prompts x n=4, 16 tokens, 2 steps
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.machine import machine_description

REWARD_KEYS = ("sql_format", "sql_executability", "sql_execution")
CONFIGURATIONS: dict[str, tuple[str, ...]] = {
    "gdpo": ("algorithm.adv_estimator=gdpo",),
    "mrtpo shared": ("algorithm.adv_estimator=mrtpo", "mrtpo.replay.share_prefix=true"),
    "mrtpo unshared": ("algorithm.adv_estimator=mrtpo", "mrtpo.replay.share_prefix=false"),
}
RUN_TIMEOUT_S = 1800
REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3, help="prompts per step (default: %(default)s)")
    parser.add_argument("--n", type=int, default=4, help="responses per prompt, rollout.n (default: %(default)s)")
    parser.add_argument("--response-length", type=int, default=48, help="max response tokens (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3, help="steps per run, the first is warm-up (default: 3)")
    parser.add_argument("--rounds", type=int, default=1, help="times each configuration runs (default: 1)")
    parser.add_argument(
        "--skip-zero-advantage",
        action="store_true",
        help="keep MRTPO's exact skipping on (default off: short responses often score alike in a group, and "
        "skipping would then replay nothing; off measures the replay of every (group, reward) pair, its upper bound)",
    )
    parser.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens, 2 steps: a check that it runs")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep run folders here (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.response_length, args.steps = 2, 16, 2
    for name in ("prompts", "n", "response_length", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.steps < 2:
        parser.error(f"--steps must be at least 2 (the first step is warm-up), got {args.steps}")
    return args


def shortest_sql_rows(out_dir: Path, count: int, model_dir: Path) -> int:
    """Write the ``count`` shortest bundled Spider prompts (chat-rendered tokens) as train/val parquet.

    Returns the longest prompt's token count (the run's ``max_prompt_length``).
    """
    import pandas as pd
    from transformers import AutoTokenizer

    source = out_dir / "spider"
    subprocess.run(
        [sys.executable, str(REPO / "recipes/data/prepare_text_to_sql.py"), "--output-dir", str(source)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    frame = pd.read_parquet(source / "train.parquet")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Rendered text, then tokenized: apply_chat_template(tokenize=True) returns a dict in recent transformers.
    lengths = [
        len(
            tokenizer(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False))[
                "input_ids"
            ]
        )
        for messages in frame["prompt"]
    ]
    frame = frame.assign(tokens=lengths).sort_values("tokens", kind="stable").head(count)
    frame.drop(columns="tokens").to_parquet(out_dir / "train.parquet", index=False)
    frame.drop(columns="tokens").to_parquet(out_dir / "val.parquet", index=False)
    return int(frame["tokens"].max())


@dataclass
class Summary:
    """One configuration's figures over all its rounds (steady state: every step after the first)."""

    name: str
    first_step_s: float
    step_s: float
    replay_s: float
    replayed_tokens: float
    shared_tokens: float

    @property
    def replay_share(self) -> float:
        return self.replay_s / self.step_s if self.step_s else 0.0


def summarise(name: str, runs: list[dict[int, dict]]) -> Summary:
    """Medians of ``timing_s/step`` and ``mrtpo/replay/*`` over the later steps of ``runs`` (metrics by step)."""
    first = [metrics[min(metrics)]["timing_s/step"] for metrics in runs]
    later = [data for metrics in runs for step, data in metrics.items() if step != min(metrics)]
    if not later:
        raise ValueError(f"{name}: no step after the first was logged")

    def median(key: str) -> float:
        return statistics.median(float(data.get(key, 0.0)) for data in later)

    return Summary(
        name,
        statistics.median(first),
        median("timing_s/step"),
        median("mrtpo/replay/time_s"),
        median("mrtpo/replay/tokens_replayed"),
        median("mrtpo/replay/prefix_tokens_shared"),
    )


def table(summaries: list[Summary]) -> list[str]:
    """Markdown table; ratios are step time / the ``gdpo`` row's step time."""
    baseline = next(s for s in summaries if s.name == "gdpo")
    lines = [
        "| configuration | first step (s) | step, steady (s) | replay (s) | replay share | replayed tokens "
        "| prefix tokens shared | step / GDPO |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.name} | {s.first_step_s:.1f} | {s.step_s:.1f} | {s.replay_s:.1f} | {100 * s.replay_share:.0f}% "
            f"| {s.replayed_tokens:.0f} | {s.shared_tokens:.0f} | {s.step_s / baseline.step_s:.2f}x |"
        )
    return lines


def run_configuration(root: Path, name: str, round_index: int, args: argparse.Namespace, prompt_length: int) -> dict:
    from mrtpo_cpu.launch import cpu_overrides, reward_overrides, run_main_ppo

    out = root / f"{name.replace(' ', '_')}_{round_index}"
    overrides = cpu_overrides(
        model_path=root / "model",
        train_files=root / "train.parquet",
        val_files=root / "val.parquet",
        ckpt_dir=out / "ckpt",
        prompt_length=prompt_length,
        response_length=args.response_length,
        batch_size=args.prompts,
        n=args.n,
        total_steps=args.steps,
        extra=(
            *CONFIGURATIONS[name],
            *reward_overrides(["text_to_sql"], REWARD_KEYS, [key + "_info" for key in REWARD_KEYS]),
            "trainer.logger=[console,file]",
            "data.seed=7",
            f"mrtpo.replay.skip_zero_advantage={str(args.skip_zero_advantage).lower()}",
        ),
    )
    run = run_main_ppo(out, overrides, RUN_TIMEOUT_S)
    if run["returncode"] != 0 or len(run["metrics"]) < args.steps:
        raise SystemExit(f"{name} run {round_index} failed (rc {run['returncode']}):\n{run['log'][-4000:]}")
    return run


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    from mrtpo_cpu.launch import save_derived_model

    with tempfile.TemporaryDirectory(prefix="step_overhead_") as temp:
        root = args.work_dir or Path(temp)
        root.mkdir(parents=True, exist_ok=True)
        save_derived_model(root / "model", num_layers=None)  # the full 30-layer model
        prompt_length = shortest_sql_rows(root, args.prompts, root / "model")
        print(*machine_description("benchmarks.step_overhead", list(argv or sys.argv[1:])), sep="\n")
        print(
            f"SmolLM2-135M-Instruct (30 layers, fp32), verl CPU backend; {args.prompts} Spider prompts "
            f"(<= {prompt_length} tokens) x n={args.n}, response <= {args.response_length} tokens, "
            f"{args.steps} steps per run, {args.rounds} round(s), skip_zero_advantage={args.skip_zero_advantage}; "
            f"run order: {', '.join(CONFIGURATIONS)}",
            flush=True,
        )
        runs: dict[str, list[dict[int, dict]]] = {name: [] for name in CONFIGURATIONS}
        for round_index in range(args.rounds):
            for name in CONFIGURATIONS:
                run = run_configuration(root, name, round_index, args, prompt_length)
                runs[name].append(run["metrics"])
                print(
                    f"  {name} round {round_index}: step times "
                    + ", ".join(f"{d['timing_s/step']:.1f}" for _, d in sorted(run["metrics"].items())),
                    flush=True,
                )
        print(*table([summarise(name, metrics) for name, metrics in runs.items()]), sep="\n")


if __name__ == "__main__":
    main()

"""The comparison's report: a plot per reward and a markdown page of tables with intervals.

From every finished run's records (``records.jsonl``):

- per reward, a PNG with the evaluation curve of each arm (mean over seeds, 95% Student-t band)
  and the training-batch mean (dashed; mean over seeds);
- per reward and arm: the evaluation before training, the final evaluation (mean, 95% t interval),
  the evaluation's mean over the training steps (the area under the curve: how early it rose), each
  with its difference to ``gdpo`` paired by seed, and the steps each seed took to reach the threshold;
- per arm: median step time (steps after the first; evaluation excluded) and its ratio to ``gdpo``,
  the final KL and entropy;
- per arm and reward: the share of training groups without signal, and for MRTPO arms the relevance
  concentration and the largest token weight.

The threshold of a reward, unless given, is the evaluation before training plus half of the best
arm's mean improvement at the last step (so it is reachable by the best arm on average; none when
no arm improved); it is printed in the report.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.learning.stats import Interval, steps_to_threshold, t_interval

__all__ = ["Comparison", "write_report"]

Records = list[dict[str, Any]]


class Comparison:
    """Finished runs' records, indexed by arm and seed."""

    def __init__(self, runs: Mapping[tuple[str, int], Records], keys: Sequence[str], arms: Sequence[str]) -> None:
        self.runs = dict(runs)
        self.keys = tuple(keys)
        self.arms = tuple(arm for arm in arms if any(a == arm for a, _ in self.runs))

    def seeds(self, arm: str) -> list[int]:
        return sorted(seed for a, seed in self.runs if a == arm)

    def eval_curve(self, arm: str, seed: int, key: str) -> list[tuple[int, float]]:
        """(step, evaluation) of the run; empty when that run has not finished (a pair's gdpo run may not)."""
        return [(r["step"], r["eval"][key]) for r in self.runs.get((arm, seed), []) if key in r.get("eval", {})]

    def train_curve(self, arm: str, seed: int, key: str) -> list[tuple[int, float]]:
        return [(r["step"], r["train"][key]) for r in self.runs[(arm, seed)] if key in r.get("train", {})]

    def final_eval(self, arm: str, seed: int, key: str) -> float | None:
        curve = self.eval_curve(arm, seed, key)
        return max(curve)[1] if curve else None

    def mean_eval(self, arm: str, seed: int, key: str) -> float | None:
        """The evaluation's mean over the evaluated training steps (step 0 excluded): the area under the curve."""
        values = [value for step, value in self.eval_curve(arm, seed, key) if step > 0]
        return statistics.fmean(values) if values else None

    def initial_eval(self, key: str) -> float | None:
        curves = [sorted(self.eval_curve(arm, seed, key)) for arm, seed in self.runs]
        values = [curve[0][1] for curve in curves if curve and curve[0][0] == 0]
        return statistics.fmean(values) if values else None

    def threshold(self, key: str, given: Mapping[str, float]) -> float | None:
        if key in given:
            return given[key]
        start = self.initial_eval(key)
        finals = [
            statistics.fmean(values)
            for arm in self.arms
            if (values := [v for s in self.seeds(arm) if (v := self.final_eval(arm, s, key)) is not None])
        ]
        if start is None or not finals or max(finals) <= start:
            return None  # no arm improved on average: nothing to reach
        return start + 0.5 * (max(finals) - start)

    def scalar(self, arm: str, field: str, skip_first: bool = True) -> list[float]:
        """``field`` of every training step of the arm's runs (all seeds); the first step is warm-up."""
        values = []
        for seed in self.seeds(arm):
            steps = [r for r in self.runs[(arm, seed)] if r["step"] > 0 and field in r]
            values.extend(r[field] for r in steps[1 if skip_first and len(steps) > 1 else 0 :])
        return values

    def last_scalar(self, arm: str, field: str) -> Interval:
        values = []
        for seed in self.seeds(arm):
            steps = [r for r in self.runs[(arm, seed)] if r["step"] > 0 and field in r]
            if steps:
                values.append(steps[-1][field])
        return t_interval(values)


def curve_band(comparison: Comparison, arm: str, key: str, train: bool = False) -> list[tuple[int, Interval]]:
    by_step: dict[int, list[float]] = defaultdict(list)
    for seed in comparison.seeds(arm):
        curve = comparison.train_curve(arm, seed, key) if train else comparison.eval_curve(arm, seed, key)
        for step, value in curve:
            by_step[step].append(value)
    return [(step, t_interval(values)) for step, values in sorted(by_step.items())]


def plot_reward(comparison: Comparison, key: str, path: Path, title: str) -> None:
    """Evaluation curves (left) and training-batch means (right), one colour per arm.

    Thick: the mean over seeds, with its 95% t band on the left; thin: each seed. The y axis spans the
    values themselves: with two or three seeds a t band can reach far past them (t = 12.7 for two).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    values: list[float] = []
    for index, arm in enumerate(comparison.arms):
        colour = f"C{index}"
        for train, axis in ((False, left), (True, right)):
            for seed in comparison.seeds(arm):
                curve = comparison.train_curve(arm, seed, key) if train else comparison.eval_curve(arm, seed, key)
                axis.plot([s for s, _ in curve], [v for _, v in curve], "-", color=colour, alpha=0.35, lw=0.8)
                values.extend(v for _, v in curve)
            band = curve_band(comparison, arm, key, train=train)
            if not band:
                continue
            steps = [s for s, _ in band]
            seeds = band[-1][1].n
            axis.plot(steps, [i.mean for _, i in band], "o-", color=colour, lw=2, label=f"{arm} (n={seeds})")
            if not train:
                lows = [i.low if not math.isnan(i.low) else i.mean for _, i in band]
                highs = [i.high if not math.isnan(i.high) else i.mean for _, i in band]
                axis.fill_between(steps, lows, highs, color=colour, alpha=0.15)
    if values:
        low, high = min(values), max(values)
        margin = 0.05 * (high - low or 1.0)
        left.set_ylim(low - margin, high + margin)
    left.set_title(f"{key}: held-out evaluation (greedy), mean, 95% t band", fontsize=10)
    right.set_title(f"{key}: training batch mean (sampled)", fontsize=10)
    for axis in (left, right):
        axis.set_xlabel("training step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    left.set_ylabel(f"{key} (mean over responses)")
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def paired_to_gdpo(comparison: Comparison, arm: str, key: str, values: Mapping[int, float], of: Any) -> str:
    """The t interval of ``values[seed] − of("gdpo", seed, key)`` over the seeds both have ("—" for gdpo)."""
    if arm == "gdpo":
        return "—"
    pairs = [value - base for seed, value in values.items() if (base := of("gdpo", seed, key)) is not None]
    return t_interval(pairs).text() if pairs else "n/a (no gdpo run with these seeds)"


def reward_table(comparison: Comparison, key: str, thresholds: Mapping[str, float]) -> list[str]:
    threshold = comparison.threshold(key, thresholds)
    start = comparison.initial_eval(key)
    title = f"**{key}**"
    if start is not None:
        title += f" — evaluation before training {start:.3f} (mean over runs)"
    if threshold is not None:
        title += f"; threshold {threshold:.3f}"
    else:
        title += "; no threshold (no arm's final evaluation beat the start on average)"
    lines = [
        title,
        "",
        "| arm | seeds | final eval, mean [95% t] | final − gdpo, paired by seed [95% t] "
        "| eval mean over steps ≥ 1 [95% t] | its − gdpo, paired [95% t] | steps to threshold, per seed | reached |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in comparison.arms:
        seeds = comparison.seeds(arm)
        finals = {s: v for s in seeds if (v := comparison.final_eval(arm, s, key)) is not None}
        final = t_interval(list(finals.values()))
        areas = {s: v for s in seeds if (v := comparison.mean_eval(arm, s, key)) is not None}
        area = t_interval(list(areas.values()))
        paired = paired_to_gdpo(comparison, arm, key, finals, comparison.final_eval)
        paired_area = paired_to_gdpo(comparison, arm, key, areas, comparison.mean_eval)
        reach = {
            s: steps_to_threshold(comparison.eval_curve(arm, s, key), threshold) if threshold is not None else None
            for s in seeds
        }
        per_seed = ", ".join(f"s{s}: {step if step is not None else '—'}" for s, step in reach.items())
        reached = sum(step is not None for step in reach.values())
        lines.append(
            f"| {arm} | {len(seeds)} | {final.text()} | {paired} | {area.text()} | {paired_area} | {per_seed} "
            f"| {reached}/{len(seeds)} |"
        )
    return lines


def kl_field(comparison: Comparison) -> tuple[str, str]:
    """The KL to report: to the reference when a run logged it, else verl's PPO KL to the sampling policy."""
    logged = any("kl_ref" in r for records in comparison.runs.values() for r in records)
    return ("kl_ref", "final KL to the reference") if logged else ("kl_old", "final KL(new‖old)")


def timing_table(comparison: Comparison) -> list[str]:
    field, title = kl_field(comparison)
    lines = [
        "| arm | step (s), median | step / gdpo | gen (s) | old log-prob (s) | adv + replay (s) | update (s) "
        f"| eval (s) | {title} | final entropy |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = comparison.scalar("gdpo", "step_time_s")
    base_median = statistics.median(base) if base else None

    def median(arm: str, field: str) -> str:
        values = comparison.scalar(arm, field, skip_first=field != "eval_s")
        return f"{statistics.median(values):.1f}" if values else "—"

    for arm in comparison.arms:
        steps = comparison.scalar(arm, "step_time_s")
        step = statistics.median(steps) if steps else math.nan
        ratio = f"{step / base_median:.2f}x" if base_median else "—"
        lines.append(
            f"| {arm} | {step:.1f} | {ratio} | {median(arm, 'gen_s')} | {median(arm, 'old_log_prob_s')} "
            f"| {median(arm, 'adv_s')} | {median(arm, 'update_actor_s')} | {median(arm, 'eval_s')} "
            f"| {comparison.last_scalar(arm, field).text(4)} | {comparison.last_scalar(arm, 'entropy').text(3)} |"
        )
    kl_values = [value for arm in comparison.arms for value in comparison.scalar(arm, "kl_old", skip_first=False)]
    if field == "kl_old" and kl_values and not any(kl_values):
        lines += [
            "",
            "KL(new‖old) is verl's `actor/ppo_kl`: 0 here by construction, as each step makes one PPO update "
            "that starts from the policy that sampled the batch; `--kl-coef` > 0 adds a reference model and "
            "reports the KL to it instead.",
        ]
    return lines


def per_reward_mean(comparison: Comparison, arm: str, field: str, key: str) -> float | None:
    """Mean of a per-reward record field (``records.PER_REWARD``) over the arm's steps and seeds."""
    values = [
        r[field][key] for seed in comparison.seeds(arm) for r in comparison.runs[(arm, seed)] if key in r.get(field, {})
    ]
    return statistics.fmean(values) if values else None


def per_reward_table(comparison: Comparison, field: str, arms: Sequence[str], intro: str) -> list[str]:
    if not arms:
        return []
    lines = [intro, "", "| arm | " + " | ".join(comparison.keys) + " |", "|---|" + "---|" * len(comparison.keys)]
    for arm in arms:
        means = [per_reward_mean(comparison, arm, field, key) for key in comparison.keys]
        lines.append(f"| {arm} | " + " | ".join("—" if m is None else f"{m:.3f}" for m in means) + " |")
    return [*lines, ""]


def moved_table(comparison: Comparison, arms: Sequence[str]) -> list[str]:
    """Per MRTPO arm and reward: β_s · (top-10% share − 0.10), a lower bound on the advantage share moved.

    A response's weights w = (1 − β_s) + β_s · q/q̄ move the share β_s · TV(q/Σq, uniform) of the reward's
    advantage away from uniform placement, and that total variation is at least the top-10% tokens' share
    of relevance minus their uniform share (0.10 up to the rounding of 10% of a response to whole tokens).
    """
    rows = []
    for arm in arms:
        cells = []
        for key in comparison.keys:
            values = [
                r["beta"] * (r["relevance_top10"][key] - 0.10)
                for seed in comparison.seeds(arm)
                for r in comparison.runs[(arm, seed)]
                if "beta" in r and key in r.get("relevance_top10", {})
            ]
            cells.append(f"{statistics.fmean(values):.3f}" if values else "—")
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "Advantage moved by the MRTPO arms, at least: β_s × (top-10% share − 0.10) per step (β_s ramps up over "
        "the warm-up), mean over steps and seeds; the share of each reward's advantage placed away from "
        "GDPO's uniform spread is at least about this (10% of a response is rounded up to whole tokens):",
        "",
        "| arm | " + " | ".join(comparison.keys) + " |",
        "|---|" + "---|" * len(comparison.keys),
        *rows,
        "",
    ]


def signal_tables(comparison: Comparison) -> list[str]:
    """Per reward: groups without signal (every arm); relevance concentration and top token weight (MRTPO)."""
    mrtpo_arms = [arm for arm in comparison.arms if comparison.scalar(arm, "replay_s", skip_first=False)]
    logged = [
        arm
        for arm in comparison.arms
        if any(per_reward_mean(comparison, arm, "no_signal_groups", k) is not None for k in comparison.keys)
    ]
    return [
        *per_reward_table(
            comparison,
            "no_signal_groups",
            logged,
            "Training groups without signal: share of prompt groups in which a reward was the same for every "
            "response (its advantage 0 for GDPO and MRTPO alike), mean over steps and seeds:",
        ),
        *per_reward_table(
            comparison,
            "relevance_top10",
            mrtpo_arms,
            "Relevance concentration of the MRTPO arms: each reward's share of relevance on its top 10% of "
            "tokens (0.10 = uniform), mean over steps and seeds:",
        ),
        *per_reward_table(
            comparison,
            "weight_max",
            [
                arm
                for arm in mrtpo_arms
                if any(per_reward_mean(comparison, arm, "weight_max", k) for k in comparison.keys)
            ],
            "Largest token weight of the MRTPO arms per reward, w = (1 − β_s) + β_s · q/q̄ (1 = uniform, GDPO's), "
            "mean over steps and seeds:",
        ),
        *moved_table(comparison, mrtpo_arms),
    ]


def write_report(
    comparison: Comparison,
    path: Path,
    header: Sequence[str],
    thresholds: Mapping[str, float],
    status: Sequence[str],
) -> list[Path]:
    """Write the markdown page at ``path`` and one PNG per reward next to it; returns the PNG paths."""
    path.parent.mkdir(parents=True, exist_ok=True)
    plots = []
    body = [*header, "", *status, ""]
    if not comparison.runs:
        body.append("No run has finished yet.")
        path.write_text("\n".join(body) + "\n", encoding="utf-8")
        return plots
    for key in comparison.keys:
        plot = path.with_name(f"{path.stem}_{key}.png")
        plot_reward(comparison, key, plot, f"{path.stem}: {', '.join(comparison.arms)}")
        plots.append(plot)
        body += [*reward_table(comparison, key, thresholds), "", f"![{key}]({plot.name})", ""]
    body += [
        "Step time (median over steps after the first, all seeds; evaluation is timed apart), final KL and "
        "final entropy (verl's `actor/entropy`; mean [95% t] over seeds):",
        "",
        *timing_table(comparison),
        "",
        *signal_tables(comparison),
    ]
    path.write_text("\n".join(body) + "\n", encoding="utf-8")
    return plots

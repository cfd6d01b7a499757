"""Per-step records of one run, read from verl's file-logger metrics.

verl logs, per global step, the training batch's reward components (``reward/<key>/mean``, from our
trainer), the PPO KL between the updated and the sampling policy (``actor/ppo_kl``), the KL loss to
the reference when one is used (``actor/kl_loss``), the policy entropy (``actor/entropy``) and stage
timings (``timing_s/*``). Validation metrics are logged per data source as
``val-aux/<data_source>/<key>/mean@<n>`` (``val-core`` for the summed score) at step 0 (before
training), every ``trainer.test_freq`` steps and at the last step; a record's evaluation mean of a
reward is the row-weighted mean over data sources.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["VAL_METRIC", "eval_means", "step_records"]

VAL_METRIC = re.compile(r"^val-(?:core|aux)/(?P<source>.+)/(?P<key>[^/]+)/mean@(?P<n>\d+)$")

#: Record field -> verl metric name (absent metrics are left out of the record).
SCALARS = {
    "kl_old": "actor/ppo_kl",
    "kl_ref": "actor/kl_loss",
    "entropy": "actor/entropy",
    "grad_norm": "actor/grad_norm",
    "step_time_s": "timing_s/step",
    "gen_s": "timing_s/gen",
    "old_log_prob_s": "timing_s/old_log_prob",
    "adv_s": "timing_s/adv",
    "update_actor_s": "timing_s/update_actor",
    "eval_s": "timing_s/testing",
    "response_length": "response_length/mean",
    "beta": "mrtpo/beta",
    "replay_s": "mrtpo/replay/time_s",
}

#: Record field -> verl metric name per reward (absent metrics are left out of the record).
PER_REWARD = {
    "relevance_top10": "mrtpo/{key}/relevance_top10_share",
    "weight_max": "mrtpo/{key}/weight_max",
    "no_signal_groups": "reward/{key}/zero_variance_group_share",
}


def eval_means(data: Mapping[str, Any], keys: Sequence[str], val_sources: Mapping[str, int]) -> dict[str, float]:
    """Each reward's evaluation mean over data sources, weighted by their evaluation rows.

    Returns an empty dict when the step logged no validation. A source logged without a row count
    (or a count missing for a logged source) raises ``ValueError``: the weights would be wrong.
    """
    found: dict[str, dict[str, float]] = {}
    for name, value in data.items():
        match = VAL_METRIC.match(name)
        if match and match["key"] in keys:
            found.setdefault(match["key"], {})[match["source"]] = float(value)
    if not found:
        return {}
    means = {}
    for key, by_source in found.items():
        unknown = sorted(set(by_source) - set(val_sources))
        if unknown:
            raise ValueError(f"validation logged data source(s) {unknown} not in the evaluation file {val_sources}")
        total = sum(val_sources[source] for source in by_source)
        means[key] = sum(value * val_sources[source] for source, value in by_source.items()) / total
    return means


def step_records(
    metrics: Mapping[int, Mapping[str, Any]],
    keys: Sequence[str],
    val_sources: Mapping[str, int],
    arm: str,
    seed: int,
) -> list[dict[str, Any]]:
    """One record per logged step, in step order: ``train`` and ``eval`` reward means, KL, entropy, timings.

    Step 0 holds the evaluation before training only. Per reward, when logged: ``relevance_top10``
    (MRTPO arms) is its share of relevance on its top 10% of tokens (0.10 = uniform); ``weight_max``
    (MRTPO arms) its largest token weight (1 = uniform); ``no_signal_groups`` the share of prompt groups
    in which the reward was constant, so that its group-normalised advantage was 0 (no signal).
    """
    records = []
    for step in sorted(metrics):
        data = metrics[step]
        record: dict[str, Any] = {"arm": arm, "seed": seed, "step": int(step)}
        train = {key: float(data[f"reward/{key}/mean"]) for key in keys if f"reward/{key}/mean" in data}
        if train:
            record["train"] = train
        evaluation = eval_means(data, keys, val_sources)
        if evaluation:
            record["eval"] = evaluation
        for field, name in SCALARS.items():
            if name in data:
                record[field] = float(data[name])
        for field, pattern in PER_REWARD.items():
            values = {key: float(data[name]) for key in keys if (name := pattern.format(key=key)) in data}
            if values:
                record[field] = values
        records.append(record)
    return records

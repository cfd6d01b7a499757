"""Localisation on a real model: the paper's Table 4 ratio on hand-made cases.

For each case, a hand-written response to a short chat prompt is scored by the REAL verifier of its task
family (``reward_fns.dispatch.compute_score``, as in training), which yields the verifier information
``<key>_info`` of every reward. The replay contexts are built from the prompt and those strings
(``ReplayContextBuilder``), every (response, reward) pair is replayed with SmolLM2-135M-Instruct
(``ReplayScorer``), and for each named *part* of the response the localisation ratio of every reward is
reported (``mrtpo_verl.analysis.localisation``: share of the reward's distance on the part / share of tokens;
uniform = 1).

The localisation criterion, per expectation ``(reward k, part)``: ratio_k(part) > 1 and
ratio_k(part) ≥ 2 × ratio_j(part) for every other reward j.

Parts: tool calling — ``tags`` (``<tool_call>`` and the closing tag), ``body`` (the JSON text between them),
``call_fields`` (the function name, the argument names and the values: what the correctness matcher compares;
the JSON scaffolding ``{"name": ..., "arguments": {...}}`` around them is what the format check reads) and
``values``; text-to-SQL — ``fences`` (the opening ```sql and the closing fence), ``query``, ``comparison``
(the operator that differs from the gold query's) or ``table``; instruction following — what each
constraint's checker reads (title brackets, end phrase, keyword, postscript marker, quotation marks). A name
``case/variant`` is the same response under another prompt (e.g. without the format line), to show how much
the ratios depend on the prompt.

Run: ``python -m benchmarks.localisation_table`` (CPU: about 4-6 minutes for the 18 cases on 2 busy cores;
``--cases a,b`` to pick cases, ``--show-info`` for the verifier scores and information, ``--threads 1``
on shared cores).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import torch

from mrtpo_verl.replay.scorer import ReplayScorer
from tests.support.localisation_cases import CASES, Measurement, measure

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def render_table(measurements: Sequence[Measurement]) -> str:
    """A Markdown table: one row per (case, expected reward, part) with the criterion's verdict."""
    lines = [
        "| case | reward | part | tok. % | ratio | other rewards' ratios | criterion |",
        "|---|---|---|---:|---:|---|---|",
    ]
    for m in measurements:
        for reward, part in m.case.expectations:
            holds = m.check(reward, part)
            others = ", ".join(f"{key} {value:.2f}" for key, value in m.ratios[part].items() if key != reward)
            lines.append(
                f"| {m.case.name} | {reward} | {part} | {100 * m.token_share[part]:.0f} | {m.ratios[part][reward]:.2f} "
                f"| {others} | {'pass' if holds else 'FAIL'} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    from mrtpo_verl.replay.model_loading import load_causal_lm

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--show-info", action="store_true", help="print each case's scores and verifier information")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest on busy cores)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    chosen = [case for case in CASES if not args.cases or case.name in args.cases.split(",")]
    model, tokenizer = load_causal_lm()
    scorer = ReplayScorer(model)
    measurements = []
    for case in chosen:
        measurement = measure(case, model, tokenizer, scorer)
        measurements.append(measurement)
        print(f"{case.name}: {measurement.num_tokens} tokens, replay {measurement.seconds:.1f} s", file=sys.stderr)
        if args.show_info:
            print(f"## {case.name}: {measurement.num_tokens} tokens, replay {measurement.seconds:.1f} s")
            for key in measurement.reward_keys:
                print(f"  {key} = {measurement.scores[key]}: {measurement.infos[key]!r}")
    print(render_table(measurements))


if __name__ == "__main__":
    main()

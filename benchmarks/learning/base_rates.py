"""``python -m benchmarks.learning.base_rates``: how often the untrained model meets a demo task's rewards.

Before a comparison, each reward should start low but not at zero: a group of ``n`` sampled answers in
which none (or all) meets a reward gives that reward no advantage, for GDPO and MRTPO alike. For each
demo task this samples ``n`` answers to each of the first ``--prompts`` training prompts (temperature
1, no top-k/top-p, ``--response-length`` tokens, as the training rollout) and answers the evaluation
prompts greedily (as verl's validation), then prints per reward: sampled answers that meet it, groups
with mixed outcomes (the groups that carry an advantage), and greedy evaluation answers that meet it.

The model is the embedded SmolLM2-135M-Instruct (or ``--model-path``), in float32, one thread,
``torch.manual_seed(--seed)`` before each batch; answers are generated in one left-padded batch.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.learning.tasks import DEMO_TASKS, Constraint, demo_prompt, demo_split

__all__ = ["main", "reward_rates"]


def generate(model, tokenizer, prompts: Sequence[str], response_length: int, sample: bool, seed: int) -> list[str]:
    """One answer per prompt (chat template, generation prompt); sampled at temperature 1 or greedy."""
    import torch

    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    with torch.inference_mode():
        out = model.generate(**encoded, max_new_tokens=response_length, pad_token_id=tokenizer.pad_token_id, **sampling)
    start = encoded["input_ids"].shape[1]
    return [tokenizer.decode(row[start:], skip_special_tokens=True) for row in out]


def reward_rates(
    constraints: Sequence[Constraint], prompts: Sequence[str], answers: Sequence[str], n: int
) -> list[tuple[int, int]]:
    """Per constraint: (answers that meet it, groups of ``n`` consecutive answers with mixed outcomes)."""
    from reward_fns.instruction_following.checkers import check_constraint

    rates = []
    for cid, kwargs in constraints:
        met = [check_constraint(cid, kwargs, p, a).followed for p, a in zip(prompts, answers, strict=True)]
        groups = [met[i : i + n] for i in range(0, len(met), n)]
        rates.append((sum(met), sum(0 < sum(group) < len(group) for group in groups)))
    return rates


def main(argv: Sequence[str] | None = None) -> None:
    prog = "python -m benchmarks.learning.base_rates"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=list(DEMO_TASKS), default=list(DEMO_TASKS))
    parser.add_argument("--prompts", type=int, default=12, help="training prompts sampled (default: %(default)s)")
    parser.add_argument("--n", type=int, default=4, help="answers per training prompt (default: %(default)s)")
    parser.add_argument("--val-prompts", type=int, default=12, help="greedy evaluation prompts (default: %(default)s)")
    parser.add_argument("--response-length", type=int, default=24, help="tokens (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-path", type=Path, default=None, help="local HF model folder (default: SmolLM2)")
    args = parser.parse_args(argv)

    import torch

    from mrtpo_verl.replay.model_loading import load_causal_lm

    torch.set_num_threads(1)
    model, tokenizer = load_causal_lm(None if args.model_path is None else str(args.model_path))
    tokenizer.padding_side = "left"
    train, val = demo_split(args.prompts, args.val_prompts)
    for name in args.tasks:
        task = DEMO_TASKS[name]
        started = time.monotonic()
        train_prompts = [demo_prompt(q, task.constraints) for q in train for _ in range(args.n)]
        val_prompts = [demo_prompt(q, task.constraints) for q in val]
        sampled = generate(model, tokenizer, train_prompts, args.response_length, True, args.seed)
        greedy = generate(model, tokenizer, val_prompts, args.response_length, False, args.seed)
        sampled_rates = reward_rates(task.constraints, train_prompts, sampled, args.n)
        greedy_rates = reward_rates(task.constraints, val_prompts, greedy, 1)
        print(f"{name} ({len(sampled)} sampled, {len(greedy)} greedy, {args.response_length} tokens):")
        for index, ((cid, _), (met, mixed), (greedy_met, _)) in enumerate(
            zip(task.constraints, sampled_rates, greedy_rates, strict=True)
        ):
            print(
                f"  if_c{index} {cid}: sampled {met}/{len(sampled)}, mixed groups {mixed}/{args.prompts}, "
                f"greedy {greedy_met}/{len(greedy)}"
            )
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


if __name__ == "__main__":
    main()

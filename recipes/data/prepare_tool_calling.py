"""Tool-calling prompts in verl's RL parquet, from BFCL v4 as shipped in the ``bfcl-eval`` wheel.

Categories: BFCL's single-turn Python ones (default ``simple_python``, ``multiple``, ``parallel``,
``parallel_multiple``; ``--categories`` picks others, the live ones ``live_simple``,
``live_multiple``, ``live_parallel``, ``live_parallel_multiple`` included), split at random per category
(``--test-fraction``), so both splits hold every category. ``data_source`` is
``bfcl/<category>``, so verl's validation metrics come out per category.

The prompt lists the functions as JSON inside ``<tools>`` (the Hermes / Qwen2.5 tool layout) in a
system message and asks for ``<tool_call>`` blocks in the verifier's expected format; the user
turn is BFCL's question. The ground truth is BFCL's ``{"functions", "answers"}`` form.

Note: BFCL is an evaluation benchmark; training on it and reporting BFCL scores is contaminated.
Here it is the data that ships offline; for a paper-style run train on a separate tool-calling set
with the same ground-truth form (``reward_fns.tool_calling.reference``).
"""

from __future__ import annotations

import json
from typing import Any

from rl_parquet import argument_parser, random_split, readable, rl_row, shuffled, write_splits

from reward_fns.ground_truths import validate_row
from reward_fns.tool_calling.bfcl_data import NON_LIVE_CATEGORIES, PYTHON_AST_CATEGORIES, BfclItem, load_bfcl_category
from reward_fns.tool_calling.render import EXPECTED_FORMAT

ABILITY = "tool_calling"


def system_message(functions: list[dict[str, Any]]) -> dict[str, str]:
    """The functions as one JSON object per line inside ``<tools>``, then the answer format."""
    tools = "\n".join(json.dumps(function, ensure_ascii=False) for function in functions)
    content = (
        "You are a helpful assistant that answers by calling functions.\n\n"
        f"You may call one or more of these functions, described as JSON inside <tools></tools>:\n"
        f"<tools>\n{tools}\n</tools>\n\n"
        "Call every function the request needs, with argument values taken from the request.\n"
        f"{EXPECTED_FORMAT}"
    )
    return {"role": "system", "content": content}


def to_row(item: BfclItem, category: str) -> dict[str, Any]:
    # Single-turn categories: one turn, user messages only.
    user_turns = [{"role": m["role"], "content": m["content"]} for turn in item.question for m in turn]
    return rl_row(
        data_source=f"bfcl/{category}",
        messages=[system_message(item.functions), *user_turns],
        ability=ABILITY,
        ground_truth=item.ground_truth(),
        extra_info={"bfcl_id": item.id, "category": category},
    )


def main() -> None:
    parser = argument_parser("tool_calling", __doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=list(NON_LIVE_CATEGORIES), choices=PYTHON_AST_CATEGORIES)
    parser.add_argument("--test-fraction", type=float, default=0.2, help="share of each category held out")
    args = parser.parse_args()

    rows: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for category in args.categories:
        readable_items = readable(
            load_bfcl_category(category),
            lambda item, c=category: validate_row(f"bfcl/{c}", item.ground_truth(), {"index": item.id}),
            lambda item: f"BFCL item {item.id}",
            args.drop_unreadable,
        )
        for split, items in random_split(readable_items, args.test_fraction, args.seed).items():
            rows[split] += [to_row(item, category) for item in items]
    # Mix the categories, so that --max-samples keeps some of each.
    write_splits(args.output_dir, {split: shuffled(r, args.seed) for split, r in rows.items()}, args.max_samples)


if __name__ == "__main__":
    main()

"""Tool-calling prompts in verl's RL parquet, from BFCL v4 as shipped in the ``bfcl-eval`` wheel.

Categories: BFCL's single-turn AST ones (default ``simple_python``, ``multiple``, ``parallel``,
``parallel_multiple``; ``--categories`` picks others, the live ones ``live_simple``,
``live_multiple``, ``live_parallel``, ``live_parallel_multiple`` and ``simple_java``,
``simple_javascript`` included), split at random per category
(``--test-fraction``), so both splits hold every category. ``data_source`` is
``bfcl/<category>``, so verl's validation metrics come out per category.

The prompt lists the functions as JSON inside ``<tools>`` (the Hermes / Qwen2.5 tool layout) in a
system message and asks for ``<tool_call>`` blocks in the verifier's expected format; the user
turn is BFCL's question. The ground truth is BFCL's ``{"functions", "answers"}`` form.

Java and JavaScript (not in the default, since their answers are a different skill: every value is
a string of source text, e.g. ``"new ArrayList<>(Arrays.asList(\"a\"))"``, and adding them would
change the default data): the prompt shows each function as BFCL shows it to a model, every
parameter of type ``string`` with its Java / JavaScript type named in its description, plus a note
on the language; the ground truth keeps the typed docs and adds ``"language"``, which tells the
verifier to read the values by BFCL's conversion rules (``reward_fns.tool_calling.source_values``).

Note: BFCL is an evaluation benchmark; training on it and reporting BFCL scores is contaminated.
Here it is the data that ships offline; for a paper-style run train on a separate tool-calling set
with the same ground-truth form (``reward_fns.tool_calling.reference``).
"""

from __future__ import annotations

import json
from typing import Any

from rl_parquet import argument_parser, random_split, readable, rl_row, shuffled, write_splits

from reward_fns.ground_truths import validate_row
from reward_fns.tool_calling.bfcl_data import AST_CATEGORIES, NON_LIVE_CATEGORIES, BfclItem, load_bfcl_category
from reward_fns.tool_calling.render import EXPECTED_FORMAT
from reward_fns.tool_calling.source_values import JAVA, PYTHON

ABILITY = "tool_calling"


LANGUAGE_NAMES = {JAVA: "Java", "javascript": "JavaScript"}


def _as_source_parameter(node: dict[str, Any], language_name: str) -> dict[str, Any]:
    """One Java / JavaScript parameter as a model sees it: a string, its source type told in words."""
    type_name = node["type"]
    if type_name == "any":
        note = f"Any {language_name} object, written as {language_name} source text."
    else:
        note = f"A {language_name} {type_name}, written as {language_name} source text."
    items = node.get("items") if isinstance(node.get("items"), dict) else None
    if items is not None:
        note += f" Its elements are {language_name} {items.get('type')} values."
    if isinstance(node.get("properties"), dict):
        note += f" Its entries follow this schema: {json.dumps(node['properties'], ensure_ascii=False)}"
    shown = {key: value for key, value in node.items() if key not in ("type", "items", "properties")}
    return {**shown, "type": "string", "description": f"{node.get('description', '')} {note}".strip()}


def shown_functions(functions: list[dict[str, Any]], language: str) -> list[dict[str, Any]]:
    """The function docs as shown to the model: as they are for Python; for Java / JavaScript, every
    parameter typed ``string`` with its language type in the description (as BFCL prompts models)."""
    if language == PYTHON:
        return functions
    name = LANGUAGE_NAMES[language]
    shown = []
    for function in functions:
        parameters = function["parameters"]
        properties = {key: _as_source_parameter(node, name) for key, node in parameters["properties"].items()}
        description = f"{function.get('description', '')} The function is written in {name}.".strip()
        shown.append({**function, "description": description, "parameters": {**parameters, "properties": properties}})
    return shown


def system_message(functions: list[dict[str, Any]], language: str = PYTHON) -> dict[str, str]:
    """The functions as one JSON object per line inside ``<tools>``, then the answer format."""
    tools = "\n".join(json.dumps(function, ensure_ascii=False) for function in shown_functions(functions, language))
    source_note = (
        f"Give every argument value as a JSON string holding {LANGUAGE_NAMES[language]} source text "
        '(for example "42L", "true" or "new ArrayList<>(Arrays.asList(\\"a\\"))").\n'
        if language != PYTHON
        else ""
    )
    content = (
        "You are a helpful assistant that answers by calling functions.\n\n"
        f"You may call one or more of these functions, described as JSON inside <tools></tools>:\n"
        f"<tools>\n{tools}\n</tools>\n\n"
        "Call every function the request needs, with argument values taken from the request.\n"
        f"{source_note}{EXPECTED_FORMAT}"
    )
    return {"role": "system", "content": content}


def to_row(item: BfclItem, category: str) -> dict[str, Any]:
    # Single-turn categories: one turn, user messages only.
    user_turns = [{"role": m["role"], "content": m["content"]} for turn in item.question for m in turn]
    return rl_row(
        data_source=f"bfcl/{category}",
        messages=[system_message(item.functions, item.language), *user_turns],
        ability=ABILITY,
        ground_truth=item.ground_truth(),
        extra_info={"bfcl_id": item.id, "category": category},
    )


def main() -> None:
    parser = argument_parser("tool_calling", __doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=list(NON_LIVE_CATEGORIES), choices=AST_CATEGORIES)
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

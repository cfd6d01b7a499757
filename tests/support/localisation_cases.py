"""The localisation cases: hand-made responses with the parts each verifier reads, and their measurement.

Shared by ``tests/replay/test_localisation_on_cpu.py`` (asserts the criterion where it holds) and
``benchmarks/localisation_table.py`` (prints the full table). For each case, the hand-written response is scored
by the REAL verifier of its task family (``reward_fns.dispatch.compute_score``), its replay contexts are built
(``ReplayContextBuilder``) and every (response, reward) pair is replayed (``ReplayScorer``); :func:`measure`
returns each reward's localisation ratio on each named part (``mrtpo_verl.analysis.localisation``).

The localisation criterion, per expectation ``(reward k, part)``: ratio_k(part) > 1 and
ratio_k(part) ≥ DOMINANCE × ratio_j(part) for every other reward j.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mrtpo_verl.analysis.localisation import find_spans, localisation_ratio, part_mask, token_char_spans
from mrtpo_verl.replay.contexts import ReplayContextBuilder
from mrtpo_verl.replay.scorer import ReplayScorer
from reward_fns import dispatch
from reward_fns.tool_calling.render import EXPECTED_FORMAT

__all__ = ["CASES", "CASES_BY_NAME", "DOMINANCE", "Case", "Measurement", "measure"]

#: Factor by which the expected reward's ratio must exceed every other reward's ratio on the part.
DOMINANCE = 2.0


@dataclass(frozen=True)
class Case:
    """One hand-made response with the parts its verifiers read.

    Attributes:
        name: short identifier.
        family: the ``reward_fns`` family; its reward keys are the replay's rewards.
        data_source: the sample's data source (routes ``compute_score``).
        prompt: the user turn.
        system: an optional system turn before it.
        response: the response text (tokenized as is; the EOS token is appended, as in a rollout).
        ground_truth: the verifier's ground truth.
        parts: part name → substrings of the response; the part is every occurrence of each.
        expectations: (reward key, part name) pairs on which the criterion is checked.
        max_constraints: instruction-following slot count (= the prompt's constraints, so no empty slot).
    """

    name: str
    family: str
    data_source: str
    prompt: str
    response: str
    ground_truth: Any
    parts: Mapping[str, tuple[str, ...]]
    expectations: tuple[tuple[str, str], ...]
    max_constraints: int | None = None
    system: str = ""

    @property
    def messages(self) -> list[dict[str, str]]:
        """The chat prompt."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": self.prompt}]


@dataclass
class Measurement:
    """What one case measured.

    Attributes:
        case: the case.
        reward_keys: the K rewards in replay order.
        scores: reward key → verifier score.
        infos: reward key → verifier information.
        num_tokens: response tokens (EOS included).
        token_share: part name → the part's share of the tokens.
        ratios: part name → reward key → localisation ratio.
        seconds: wall time of the replay.
    """

    case: Case
    reward_keys: tuple[str, ...]
    scores: dict[str, float]
    infos: dict[str, str]
    num_tokens: int
    token_share: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def check(self, reward: str, part: str) -> bool:
        """The localisation criterion for (reward, part): ratio > 1 and ≥ DOMINANCE × every other reward's ratio.

        A NaN ratio (a reward with no distance at all) never satisfies the criterion as the expected reward and
        never blocks it as another reward.
        """
        on_part = self.ratios[part]
        own = on_part[reward]
        others = [value for key, value in on_part.items() if key != reward and not math.isnan(value)]
        return own > 1.0 and all(own >= DOMINANCE * value for value in others)


_WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}
_FLIGHTS = {
    "name": "search_flights",
    "description": "Search flights between two cities.",
    "parameters": {
        "type": "object",
        "properties": {
            "origin": {"type": "string"},
            "destination": {"type": "string"},
            "passengers": {"type": "integer"},
        },
        "required": ["origin", "destination", "passengers"],
    },
}
_WEATHER_ANSWER = {"functions": [_WEATHER], "answers": [{"get_weather": {"city": ["Paris"], "unit": ["celsius"]}}]}
_FLIGHTS_ANSWER = {
    "functions": [_FLIGHTS],
    "answers": [{"search_flights": {"origin": ["Boston"], "destination": ["Denver"], "passengers": [3]}}],
}
_WEATHER_QUESTION = "What is the weather in Paris in celsius?"
_FLIGHTS_QUESTION = "Find flights from Boston to Denver for 3 passengers."
_FLIGHTS_CALL = (
    '{"name": "search_flights", "arguments": {"origin": "Boston", "destination": "Denver", "passengers": 2}}'
)
_TAGS = ("<tool_call>", "</tool_call>")
_TOOL_EXPECTATIONS = (
    ("tool_format", "tags"),
    ("tool_correctness", "body"),
    ("tool_correctness", "call_fields"),
    ("tool_correctness", "values"),
)


def _tool_system(schema: dict[str, Any], with_format: bool) -> str:
    """The recipes' tool-calling system turn (``recipes/data/prepare_tool_calling.py``), format line optional."""
    text = (
        "You are a helpful assistant that answers by calling functions.\n\n"
        "You may call one or more of these functions, described as JSON inside <tools></tools>:\n"
        f"<tools>\n{json.dumps(schema)}\n</tools>\n\n"
        "Call every function the request needs, with argument values taken from the request."
    )
    return f"{text}\n{EXPECTED_FORMAT}" if with_format else text


def _tool_user_prompt(schema: dict[str, Any], question: str) -> str:
    """A single user turn that shows the function and names the tags."""
    return (
        f"You can call this function:\n{json.dumps(schema)}\n"
        f"Answer with the call inside <tool_call></tool_call> tags.\n\n{question}"
    )


def _tool_case(name: str, style: str, schema: dict[str, Any], question: str, **fields: Any) -> Case:
    """A tool-calling case; style "system+format" (the recipes' prompt), "system" (no format line) or "user"."""
    if style == "user":
        prompt, system = _tool_user_prompt(schema, question), ""
    else:
        prompt, system = question, _tool_system(schema, with_format=style == "system+format")
    return Case(
        name=name,
        family="tool_calling",
        data_source="bfcl",
        prompt=prompt,
        system=system,
        expectations=_TOOL_EXPECTATIONS,
        **fields,
    )


def _flights_case(name: str, style: str, closing_tag: str = "</tool_call>") -> Case:
    """The flight search with passengers=2 where the reference has 3 (the paper's Figure 7 pattern)."""
    return _tool_case(
        name,
        style,
        _FLIGHTS,
        _FLIGHTS_QUESTION,
        response=f"<tool_call>\n{_FLIGHTS_CALL}\n{closing_tag}",
        ground_truth=_FLIGHTS_ANSWER,
        parts={
            "tags": ("<tool_call>", closing_tag),
            "body": (_FLIGHTS_CALL,),
            "call_fields": ("search_flights", "origin", "Boston", "destination", "Denver", "passengers", "2"),
            "values": ("Boston", "Denver", "2"),
        },
    )


def _weather_case(name: str, style: str, unit: str) -> Case:
    call = f'{{"name": "get_weather", "arguments": {{"city": "Paris", "unit": "{unit}"}}}}'
    return _tool_case(
        name,
        style,
        _WEATHER,
        _WEATHER_QUESTION,
        response=f"<tool_call>\n{call}\n</tool_call>",
        ground_truth=_WEATHER_ANSWER,
        parts={
            "tags": _TAGS,
            "body": (call,),
            "call_fields": ("get_weather", "city", "Paris", "unit", unit),
            "values": ("Paris", unit),
        },
    )


_SQL_FORMAT_LINE = " Answer with one SQLite query in a ```sql block."
_SINGER_SCHEMA = "Database schema:\nCREATE TABLE singer (Singer_ID int, Name text, Country text, Age int)\n\n"
_SQL_EXPECTATIONS = (("sql_format", "fences"), ("sql_execution", "comparison"), ("sql_execution", "query"))


def _comparison_case(name: str, question: str, gold: str, predicted: str, operator: str, prompt: str = "") -> Case:
    """A well-formed, executable query whose comparison operator differs from the gold query's."""
    return Case(
        name=name,
        family="text_to_sql",
        data_source="spider",
        prompt=prompt or question + _SQL_FORMAT_LINE,
        response=f"```sql\n{predicted}\n```",
        ground_truth={"sql": gold, "db_id": "concert_singer"},
        parts={"fences": ("```sql", "\n```"), "query": (predicted,), "comparison": (operator,)},
        expectations=_SQL_EXPECTATIONS,
    )


_OLDER = "How many singers are older than 32?"
_OLDER_GOLD = "SELECT count(*) FROM singer WHERE age > 32"
_OLDER_PREDICTED = "SELECT count(*) FROM singer WHERE age >= 32"
_SEA = "Write two short sentences about the sea."
_TITLE = "Give it a title wrapped in double angular brackets, such as <<poem of joy>>."


def _if_case(
    name: str, prompt: str, response: str, constraints: Sequence[tuple[str, dict[str, Any]]], **fields: Any
) -> Case:
    return Case(
        name=name,
        family="instruction_following",
        data_source="ifeval",
        prompt=prompt,
        response=response,
        ground_truth={
            "instruction_id_list": [instruction for instruction, _ in constraints],
            "kwargs": [kwargs for _, kwargs in constraints],
        },
        max_constraints=len(constraints),
        **fields,
    )


CASES: tuple[Case, ...] = (
    # --- tool calling: tool_format reads the tags (and the JSON scaffolding), tool_correctness the name and arguments
    _flights_case("tool_wrong_value", "system+format"),
    _flights_case("tool_wrong_value/system_no_format_line", "system"),
    _flights_case("tool_wrong_value/user_turn", "user"),
    _flights_case("tool_unbalanced_tags", "system+format", closing_tag="</tool>"),
    _flights_case("tool_unbalanced_tags/system_no_format_line", "system", closing_tag="</tool>"),
    _weather_case("tool_correct", "system+format", "celsius"),
    _weather_case("tool_correct/user_turn", "user", "celsius"),
    _weather_case("tool_wrong_unit/system_no_format_line", "system", "fahrenheit"),
    # --- text-to-SQL: sql_format reads the fence, sql_execution compares results (the wrong operator decides)
    _comparison_case("sql_ge_for_gt", _OLDER, _OLDER_GOLD, _OLDER_PREDICTED, ">="),
    _comparison_case(
        "sql_ge_for_gt/no_format_line",
        _OLDER,
        _OLDER_GOLD,
        _OLDER_PREDICTED,
        ">=",
        _OLDER + " Answer with one SQLite query.",
    ),
    _comparison_case(
        "sql_ge_for_gt/schema_in_prompt",
        _OLDER,
        _OLDER_GOLD,
        _OLDER_PREDICTED,
        ">=",
        _SINGER_SCHEMA + _OLDER + _SQL_FORMAT_LINE,
    ),
    _comparison_case(
        "sql_le_for_lt",
        "How many singers are younger than 29?",
        "SELECT count(*) FROM singer WHERE age < 29",
        "SELECT count(*) FROM singer WHERE age <= 29",
        "<=",
    ),
    Case(
        name="sql_missing_table",
        family="text_to_sql",
        data_source="spider",
        prompt="List the names of all singers." + _SQL_FORMAT_LINE,
        response="```sql\nSELECT name FROM singers\n```",
        ground_truth={"sql": "SELECT name FROM singer", "db_id": "concert_singer"},
        parts={"fences": ("```sql", "\n```"), "query": ("SELECT name FROM singers",), "table": ("singers",)},
        expectations=(("sql_format", "fences"), ("sql_executability", "table"), ("sql_executability", "query")),
    ),
    # --- instruction following: each constraint's checker reads one part of the response
    _if_case(
        "if_title_postscript",
        f"{_SEA} {_TITLE} At the end of your response, add a postscript starting with P.S.",
        "<<The Sea>>\nThe sea is wide and deep. Waves roll onto the shore.\nP.S. I love the sea.",
        [("detectable_format:title", {}), ("detectable_content:postscript", {"postscript_marker": "P.S."})],
        parts={"title_brackets": ("<<", ">>"), "postscript_marker": ("P.S.",)},
        expectations=(("if_c0", "title_brackets"), ("if_c1", "postscript_marker")),
    ),
    _if_case(
        "if_title_end_phrase",
        f"{_SEA} {_TITLE} Finish your response with the exact phrase 'Any other questions?'.",
        "<<Ocean Song>>\nThe sea is wide and deep. Waves roll onto the shore. Any other questions?",
        [("detectable_format:title", {}), ("startend:end_checker", {"end_phrase": "Any other questions?"})],
        parts={"title_brackets": ("<<", ">>"), "end_phrase": ("Any other questions?",)},
        expectations=(("if_c0", "title_brackets"), ("if_c1", "end_phrase")),
    ),
    _if_case(
        "if_keyword_title",
        "Describe a forest in two sentences. Include the keyword owl. Your answer must contain a title, wrapped in "
        "double angular brackets, such as <<poem of joy>>.",
        "<<Green Silence>>\nTall pines stand close together in the forest. An owl calls softly from a branch at dusk.",
        [("keywords:existence", {"keywords": ["owl"]}), ("detectable_format:title", {})],
        parts={"keyword": ("owl",), "title_brackets": ("<<", ">>")},
        expectations=(("if_c0", "keyword"), ("if_c1", "title_brackets")),
    ),
    _if_case(
        "if_end_phrase_keyword",
        "Write two sentences about the sea. Include the keyword lighthouse. Finish your response with the exact "
        "phrase 'Any other questions?'.",
        "The sea is wide and deep. A lighthouse guards the rocky coast at night. Any other questions?",
        [
            ("startend:end_checker", {"end_phrase": "Any other questions?"}),
            ("keywords:existence", {"keywords": ["lighthouse"]}),
        ],
        parts={"end_phrase": ("Any other questions?",), "keyword": ("lighthouse",)},
        expectations=(("if_c0", "end_phrase"), ("if_c1", "keyword")),
    ),
    _if_case(
        "if_end_phrase_keyword/long_phrase",
        "Write two sentences about the sea. Include the keyword lighthouse. End your response with the exact phrase "
        "'Is there anything else I can help with?'.",
        "The sea is wide and deep. A lighthouse guards the rocky coast at night. "
        "Is there anything else I can help with?",
        [
            ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"}),
            ("keywords:existence", {"keywords": ["lighthouse"]}),
        ],
        parts={"end_phrase": ("Is there anything else I can help with?",), "keyword": ("lighthouse",)},
        expectations=(("if_c0", "end_phrase"), ("if_c1", "keyword")),
    ),
    _if_case(
        "if_keyword_quotation",
        f"{_SEA} Include the keyword lighthouse. Wrap your entire response with double quotation marks.",
        '"The sea is wide and deep. A lighthouse guards the rocky coast."',
        [("keywords:existence", {"keywords": ["lighthouse"]}), ("startend:quotation", {})],
        parts={"keyword": ("lighthouse",), "quotes": ('"',)},
        expectations=(("if_c0", "keyword"), ("if_c1", "quotes")),
    ),
)
CASES_BY_NAME: dict[str, Case] = {case.name: case for case in CASES}


def measure(case: Case, model: Any, tokenizer: Any, scorer: ReplayScorer | None = None) -> Measurement:
    """Score ``case`` with its real verifier, replay it, and compute every reward's ratio on every part."""
    scorer = scorer or ReplayScorer(model)
    reward_keys = dispatch.reward_keys(case.family, case.max_constraints)
    response_ids = [*tokenizer(case.response, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    # What the reward loop sees: the decoded response without special tokens.
    solution = tokenizer.decode(response_ids, skip_special_tokens=True)
    result = dispatch.compute_score(
        case.data_source, solution, case.ground_truth, families=case.family, max_constraints=case.max_constraints
    )
    infos = {key: result[dispatch.info_key(key)] for key in reward_keys}
    builder = ReplayContextBuilder(tokenizer, reward_keys)
    contexts = builder.build(case.messages, response_ids, list(infos.values()))
    start = time.perf_counter()
    relevance = scorer.score([contexts], torch.ones(1, len(reward_keys), dtype=torch.bool)).relevance[0].cpu()
    seconds = time.perf_counter() - start

    decoded = tokenizer.decode(response_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    spans = token_char_spans(tokenizer, response_ids)
    measurement = Measurement(
        case=case,
        reward_keys=reward_keys,
        scores={key: float(result[key]) for key in reward_keys},
        infos=infos,
        num_tokens=len(response_ids),
        seconds=seconds,
    )
    for part, needles in case.parts.items():
        mask = part_mask(spans, [span for needle in needles for span in find_spans(decoded, needle)])
        ratios = localisation_ratio(relevance, mask)
        measurement.token_share[part] = float(mask.float().mean())
        measurement.ratios[part] = {key: float(ratios[k]) for k, key in enumerate(reward_keys)}
    return measurement

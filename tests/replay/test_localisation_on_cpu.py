"""Localisation on a real model: each reward's replay distance falls on what its verifier reads.

Hand-made responses of each task family are scored by the REAL verifiers (``reward_fns.dispatch.compute_score``,
as in training) for their verifier information, replayed with SmolLM2-135M-Instruct through
``ReplayContextBuilder`` and ``ReplayScorer`` (every pair needed), and checked against the localisation criterion
on the part each verifier reads: the paper's Table 4 ratio (share of the reward's distance on the part /
share of tokens; uniform = 1) is above 1 and at least twice every other reward's ratio on that part.

The cases are in ``tests/support/localisation_cases.py``; ``benchmarks/localisation_table.py`` prints the full
table of ratios (including the (case, reward, part) triples that do not meet the criterion with this 135M model);
only triples that meet it are asserted here. The cheap tests at the top check the ratio and the token → character
mapping themselves.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mrtpo_verl.analysis.localisation import find_spans, localisation_ratio, part_mask, token_char_spans
from mrtpo_verl.replay.scorer import ReplayScorer
from tests.support.localisation_cases import CASES_BY_NAME, DOMINANCE, Measurement, measure

#: (case, reward, part) triples asserted; the reason each verifier reads that part is in the comment.
LOCALISED = [
    # tool_correctness_info lists the reference call search_flights(origin="Boston", destination="Denver",
    # passengers=3) and "Problems: search_flights.passengers: wrong value 2"; the matcher compares the function
    # name, the argument names and the values, not the JSON scaffolding the format check reads.
    ("tool_wrong_value", "tool_correctness", "call_fields"),
    ("tool_wrong_value", "tool_correctness", "values"),
    # tool_format_info: "Expected format: one or more <tool_call>...</tool_call> blocks ... Problem: unbalanced
    # <tool_call> ... </tool_call> tags" (the response closes with </tool>), and the system turn does not state
    # the format. The margin is small (2.09 against 2 × 0.94); with the format line in the system turn (the
    # recipes' prompt) and in the well-formed cases tool_format on the tags stays at 1.1-1.8, below twice
    # tool_correctness: see the table.
    ("tool_unbalanced_tags/system_no_format_line", "tool_format", "tags"),
    # sql_execution_info: "Gold SQL: SELECT count(*) FROM singer WHERE age > 32" and its result (3,); the response
    # uses >= 32, which returns 4: the operator decides the execution reward.
    ("sql_ge_for_gt", "sql_execution", "comparison"),
    # if_c0_info: "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."
    ("if_title_postscript", "if_c0", "title_brackets"),
]


# --- the ratio and the part mask, without the model -------------------------------------------------------


def test_uniform_relevance_gives_ratio_one() -> None:
    relevance = torch.full((2, 8), 0.3)
    part = torch.tensor([True, True, False, False, False, False, False, False])
    assert torch.allclose(localisation_ratio(relevance, part), torch.ones(2, dtype=torch.float64))


def test_ratio_is_distance_share_over_token_share() -> None:
    relevance = torch.tensor([[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    part = torch.tensor([True, False, False, False])  # 1/4 of the tokens
    ratio = localisation_ratio(relevance, part)
    assert ratio.tolist() == pytest.approx([(3 / 4) / (1 / 4), 0.0])


def test_invalid_tokens_count_nowhere_and_degenerate_cases_are_nan() -> None:
    relevance = torch.tensor([[1.0, 1.0, 5.0], [0.0, 0.0, 0.0]])
    part = torch.tensor([True, False, True])
    valid = torch.tensor([True, True, False])
    ratio = localisation_ratio(relevance, part, valid)
    assert ratio[0].item() == pytest.approx((1 / 2) / (1 / 2))
    assert torch.isnan(ratio[1])  # no distance at all
    assert torch.isnan(localisation_ratio(relevance, torch.zeros(3, dtype=torch.bool))).all()  # empty part
    with pytest.raises(ValueError, match="part must be"):
        localisation_ratio(relevance, torch.ones(4, dtype=torch.bool))


def test_part_mask_and_find_spans() -> None:
    spans = [(0, 3), (3, 4), (4, 9), (9, 9), (9, 12)]
    assert part_mask(spans, [(2, 5)]).tolist() == [True, True, True, False, False]
    assert part_mask(spans, [(9, 10)]).tolist() == [False, False, False, False, True]  # empty spans never match
    assert find_spans("a>=b>=c", ">=") == [(1, 3), (4, 6)]
    with pytest.raises(ValueError, match="does not occur"):
        find_spans("abc", "x")


@pytest.mark.slow
def test_token_char_spans_tile_the_decoded_replayed_ids(smollm2: tuple[Any, Any]) -> None:
    _, tokenizer = smollm2
    text = '<tool_call>\n{"name": "f", "arguments": {"x": "héllo → 2"}}\n</tool_call>'
    ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    decoded = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    spans = token_char_spans(tokenizer, ids)
    assert len(spans) == len(ids)
    assert spans[0][0] == 0 and spans[-1][1] == len(decoded)
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    assert "".join(decoded[start:end] for start, end in spans) == decoded
    assert decoded[spans[-1][0] : spans[-1][1]] == tokenizer.eos_token  # the EOS token is its own span
    tag = part_mask(spans, find_spans(decoded, "<tool_call>"))
    assert tokenizer.decode([i for i, keep in zip(ids, tag.tolist(), strict=True) if keep]) == "<tool_call>"


# --- the localisation criterion on the real model --------------------------------------------------------------


@pytest.fixture(scope="module")
def measurements(smollm2: tuple[Any, Any]) -> dict[str, Measurement]:
    """Each case with an asserted triple, measured once (real verifier, contexts, replay with every pair)."""
    model, tokenizer = smollm2
    scorer = ReplayScorer(model)
    names = dict.fromkeys(case for case, _, _ in LOCALISED)
    return {name: measure(CASES_BY_NAME[name], model, tokenizer, scorer) for name in names}


@pytest.mark.slow
@pytest.mark.parametrize(("case", "reward", "part"), LOCALISED, ids=["/".join(t) for t in LOCALISED])
def test_reward_relevance_falls_on_the_part_its_verifier_reads(
    measurements: dict[str, Measurement], case: str, reward: str, part: str
) -> None:
    measured = measurements[case]
    ratios = measured.ratios[part]
    others = {key: value for key, value in ratios.items() if key != reward}
    assert measured.infos[reward], f"{reward} has no verifier information"
    assert ratios[reward] > 1.0, f"{case}: {reward} on {part} has ratio {ratios[reward]:.2f} ≤ 1 (others: {others})"
    for other, value in others.items():
        assert ratios[reward] >= DOMINANCE * value, (
            f"{case}: {reward} on {part} has ratio {ratios[reward]:.2f} < {DOMINANCE} × {other}'s {value:.2f}"
        )
    assert measured.check(reward, part)


@pytest.mark.slow
def test_cases_are_scored_by_the_real_verifiers(measurements: dict[str, Measurement]) -> None:
    """The verifier outcomes the cases are built on (so a verifier change shows up here, not as a ratio drift)."""
    assert measurements["tool_wrong_value"].scores == {"tool_format": 1.0, "tool_correctness": pytest.approx(8 / 9)}
    assert "passengers: wrong value 2" in measurements["tool_wrong_value"].infos["tool_correctness"]
    unbalanced = measurements["tool_unbalanced_tags/system_no_format_line"]
    assert unbalanced.scores == {"tool_format": 0.0, "tool_correctness": 0.0}
    assert "unbalanced <tool_call>" in unbalanced.infos["tool_format"]
    assert measurements["sql_ge_for_gt"].scores == {"sql_format": 1.0, "sql_executability": 1.0, "sql_execution": 0.0}
    assert "age > 32" in measurements["sql_ge_for_gt"].infos["sql_execution"]
    assert measurements["if_title_postscript"].scores == {"if_c0": 1.0, "if_c1": 1.0}
    assert "double angular brackets" in measurements["if_title_postscript"].infos["if_c0"]

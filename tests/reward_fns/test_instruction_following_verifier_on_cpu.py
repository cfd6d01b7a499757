"""compute_score of the instruction-following verifier: keys, slots, verdicts, info strings."""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reward_fns.instruction_following import (
    DATA_SOURCES,
    EMPTY_SLOT_INFO,
    EMPTY_SLOT_SCORE,
    MAX_CONSTRAINTS,
    REWARD_KEYS,
    UNSUPPORTED,
    UnsupportedConstraintError,
    compute_score,
    reward_keys,
    verifier,
)
from reward_fns.instruction_following.data import load_benchmark
from reward_fns.process_pool.pool import close_shared_pool, shared_pool

LOWERCASE = ("change_case:english_lowercase", {})
AT_LEAST_300_WORDS = ("length_constraints:number_words", {"relation": "at least", "num_words": 300})
LESS_THAN_50_WORDS = ("length_constraints:number_words", {"relation": "less than", "num_words": 50})
JSON_FORMAT = ("detectable_format:json_format", {})
THREE_BULLETS = ("detectable_format:number_bullet_lists", {"num_bullets": 3})
KEYWORDS = ("keywords:existence", {"keywords": ["banana", "kiwi"]})
NO_COMMA = ("punctuation:no_comma", {})
FEWER_THAN_3_SENTENCES = ("length_constraints:number_sentences", {"relation": "less than", "num_sentences": 3})
GERMAN = ("language:response_language", {"language": "de"})
THREE_TO_FIVE_WORDS = ("count:word_count_range", {"min_words": 3, "max_words": 5})
EMOJI_PER_SENTENCE = ("format:emoji", {})
TRIGRAM_OVERLAP = ("ratio:overlap", {"reference_text": "the cat sat on the mat today", "percentage": 50})


def _network_refused(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"network access attempted: {args!r}")


@pytest.fixture(autouse=True, scope="module")
def no_network() -> Iterator[None]:
    """Fails any test of this module that opens a connection or resolves a host name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _network_refused)
        patch.setattr(socket, "create_connection", _network_refused)
        patch.setattr(socket, "getaddrinfo", _network_refused)
        yield


def _ground_truth(*constraints: tuple[str, dict]) -> dict:
    return {
        "instruction_id_list": [instruction_id for instruction_id, _ in constraints],
        "kwargs": [kwargs for _, kwargs in constraints],
        "prompt": "A prompt.",
    }


def _score(response: str, *constraints: tuple[str, dict], max_constraints: int = MAX_CONSTRAINTS) -> dict:
    return compute_score("ifeval", response, _ground_truth(*constraints), max_constraints=max_constraints)


def test_keys_and_data_sources() -> None:
    assert MAX_CONSTRAINTS == 3
    assert reward_keys() == REWARD_KEYS == ("if_c0", "if_c1", "if_c2")
    assert reward_keys(5) == ("if_c0", "if_c1", "if_c2", "if_c3", "if_c4")
    assert DATA_SOURCES == ("ifeval", "ifbench", "muldimif", "instruction_following")


def test_max_constraints_is_the_largest_instruction_count_in_the_packaged_data() -> None:
    counts = [len(r["instruction_id_list"]) for b in ("ifeval", "ifbench") for r in load_benchmark(b)]

    assert max(counts) == MAX_CONSTRAINTS


@pytest.mark.parametrize("constraints", [(NO_COMMA,), (NO_COMMA, KEYWORDS), (NO_COMMA, KEYWORDS, LOWERCASE)])
def test_every_prompt_returns_the_same_keys(constraints: tuple) -> None:
    scores = _score("some response", *constraints)

    expected = {"score", "reward/instruction_following/internal_errors", "reward/instruction_following/timeouts"}
    expected |= {"reward/instruction_following/language_undetected", *REWARD_KEYS}
    assert set(scores) == expected | {f"{key}_info" for key in REWARD_KEYS}
    assert all(isinstance(scores[key], float) for key in ("score", *REWARD_KEYS))
    assert all(isinstance(scores[f"{key}_info"], str) for key in REWARD_KEYS)


@pytest.mark.parametrize(
    ("constraint", "satisfying", "violating"),
    [
        (LOWERCASE, "this reply is written in plain lowercase english words.", "This Reply Has Capitals."),
        (AT_LEAST_300_WORDS, "word " * 300, "word " * 299),
        (LESS_THAN_50_WORDS, "just a few words", "word " * 50),
        (JSON_FORMAT, '```json\n{"answer": 42}\n```', "answer: 42"),
        (THREE_BULLETS, "* one\n* two\n* three", "* one\n* two"),
        (KEYWORDS, "I like Banana and kiwi.", "I like banana only."),
        (NO_COMMA, "no commas here", "one, two"),
        (FEWER_THAN_3_SENTENCES, "Dr. Smith went home at 5 p.m. today. He was tired.", "One. Two. Three."),
        (GERMAN, "Das ist ein kurzer Satz auf Deutsch, der ganz sicher deutsch ist.", "This is English."),
        (THREE_TO_FIVE_WORDS, "one two three four", "one two"),
        (EMOJI_PER_SENTENCE, "I love pizza 🍕. It is tasty 😋.", "I love pizza 🍕. It is tasty."),
    ],
    ids=lambda value: value[0] if isinstance(value, tuple) else None,
)
def test_hand_made_responses_score_as_expected(constraint: tuple, satisfying: str, violating: str) -> None:
    assert _score(satisfying, constraint)["if_c0"] == 1.0
    assert _score(violating, constraint)["if_c0"] == 0.0


def test_slots_follow_ground_truth_order_and_score_is_the_fraction() -> None:
    scores = _score(
        "this reply is written in plain english, and it mentions banana and kiwi.", LOWERCASE, NO_COMMA, KEYWORDS
    )

    assert (scores["if_c0"], scores["if_c1"], scores["if_c2"]) == (1.0, 0.0, 1.0)
    assert scores["score"] == pytest.approx(2 / 3)


def test_info_is_the_checkers_description_and_empty_slots_are_constant() -> None:
    scores = _score("whatever", AT_LEAST_300_WORDS, THREE_TO_FIVE_WORDS)

    assert scores["if_c0_info"] == "Answer with at least 300 words."
    assert scores["if_c1_info"] == "The response must contain between 3 and 5 words."
    assert scores["if_c2"] == EMPTY_SLOT_SCORE == 0.0
    assert scores["if_c2_info"] == EMPTY_SLOT_INFO == ""


def test_empty_slots_cannot_differ_inside_a_group() -> None:
    group = ["word " * n for n in (0, 3, 10, 400)]

    empty_slot_values = {(s["if_c1"], s["if_c1_info"], s["if_c2"], s["if_c2_info"]) for s in map(_group_score, group)}
    assert empty_slot_values == {(EMPTY_SLOT_SCORE, EMPTY_SLOT_INFO, EMPTY_SLOT_SCORE, EMPTY_SLOT_INFO)}


def _group_score(response: str) -> dict:
    return _score(response, AT_LEAST_300_WORDS)


def test_info_is_non_empty_for_every_real_constraint() -> None:
    for benchmark in ("ifeval", "ifbench"):
        for record in load_benchmark(benchmark):
            if set(record["instruction_id_list"]) & set(UNSUPPORTED):
                continue
            try:
                scores = compute_score(benchmark, "A response.", record)
            except UnsupportedConstraintError:  # the few arguments the checkers cannot represent
                continue
            for slot, key in enumerate(REWARD_KEYS):
                assert bool(scores[f"{key}_info"].strip()) == (slot < len(record["instruction_id_list"]))


def test_blank_response_fails_every_constraint() -> None:
    scores = _score("   \n", NO_COMMA, LESS_THAN_50_WORDS)

    assert (scores["score"], scores["if_c0"], scores["if_c1"]) == (0.0, 0.0, 0.0)


def test_a_checker_that_raises_on_the_response_counts_as_not_followed() -> None:
    # IFBench's ratio:overlap divides by the response's trigram count: zero for "x".
    scores = _score("x", TRIGRAM_OVERLAP, NO_COMMA)

    assert (scores["if_c0"], scores["if_c1"], scores["score"]) == (0.0, 1.0, 0.5)


def test_too_many_constraints_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"4 instruction-following constraints.*max_constraints=3"):
        _score("text", NO_COMMA, KEYWORDS, LOWERCASE, JSON_FORMAT)

    assert _score("text", NO_COMMA, KEYWORDS, LOWERCASE, JSON_FORMAT, max_constraints=4)["if_c3_info"]


@pytest.mark.parametrize("max_constraints", [0, -1, 2.0, True])
def test_invalid_slot_count_is_rejected(max_constraints: object) -> None:
    with pytest.raises(ValueError, match="max_constraints must be a positive int"):
        _score("text", NO_COMMA, max_constraints=max_constraints)  # type: ignore[arg-type]


def test_missing_argument_is_refused_instead_of_drawn_at_random() -> None:
    with pytest.raises(UnsupportedConstraintError, match="'num_words' is missing"):
        _score("text", ("length_constraints:number_words", {"relation": "at least"}))


@pytest.mark.parametrize(
    "ground_truth",
    [
        {"instruction_id_list": ["x"]},
        {"instruction_id_list": [], "kwargs": []},
        {"instruction_id_list": ["punctuation:no_comma", "keywords:existence"], "kwargs": [{}]},
        "not json",
        ["punctuation:no_comma"],
    ],
)
def test_malformed_ground_truth_is_rejected(ground_truth: object) -> None:
    with pytest.raises(ValueError):
        compute_score("ifeval", "text", ground_truth)  # type: ignore[arg-type]


def test_ground_truth_as_json_string_none_padded_kwargs_or_numpy_arrays_scores_the_same() -> None:
    plain = _ground_truth(NO_COMMA, THREE_BULLETS, KEYWORDS)
    none_padded = {**plain, "kwargs": [{**kwargs, "num_words": None, "language": None} for kwargs in plain["kwargs"]]}
    from_parquet = {
        "instruction_id_list": np.array(plain["instruction_id_list"], dtype=object),
        "kwargs": np.array(
            [{}, {"num_bullets": np.float64(3.0)}, {"keywords": np.array(["banana", "kiwi"], dtype=object)}],
            dtype=object,
        ),
    }
    response = "* banana\n* kiwi\n* apple"

    expected = compute_score("ifeval", response, plain)
    assert expected["score"] == 1.0
    for variant in (json.dumps(plain), none_padded, from_parquet):
        assert compute_score("ifeval", response, variant) == expected


def test_scores_are_deterministic() -> None:
    response = "Ceci est une réponse courte, mais elle est écrite en français."

    assert _score(response, GERMAN, NO_COMMA) == _score(response, GERMAN, NO_COMMA)


_SUPPORTED_POOL = [
    LOWERCASE,
    AT_LEAST_300_WORDS,
    LESS_THAN_50_WORDS,
    JSON_FORMAT,
    THREE_BULLETS,
    KEYWORDS,
    NO_COMMA,
    FEWER_THAN_3_SENTENCES,
    THREE_TO_FIVE_WORDS,
    EMOJI_PER_SENTENCE,
    TRIGRAM_OVERLAP,
    ("format:no_whitespace", {}),
    ("startend:quotation", {}),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}),
]
_RESPONSE_PIECES = ["word", "Banana", "kiwi", ",", ".", "\n", "* ", '"', "P.S.", "😋", "{}", " "]


@settings(max_examples=150, deadline=None)
@given(
    constraints=st.lists(st.sampled_from(_SUPPORTED_POOL), min_size=1, max_size=MAX_CONSTRAINTS + 2),
    response=st.one_of(st.text(max_size=60), st.lists(st.sampled_from(_RESPONSE_PIECES), max_size=40).map("".join)),
    extra_slots=st.integers(min_value=0, max_value=2),
)
def test_score_is_the_mean_of_the_non_empty_slots(constraints: list, response: str, extra_slots: int) -> None:
    max_constraints = len(constraints) + extra_slots
    scores = _score(response, *constraints, max_constraints=max_constraints)

    keys = reward_keys(max_constraints)
    filled = [scores[key] for key in keys if scores[f"{key}_info"] != EMPTY_SLOT_INFO]
    assert len(filled) == len(constraints)
    assert scores["score"] == pytest.approx(sum(filled) / len(filled))
    assert all(scores[key] in (0.0, 1.0) for key in keys)
    assert all(scores[key] == EMPTY_SLOT_SCORE for key in keys[len(constraints) :])


def test_short_answers_checked_in_many_threads_score_as_the_pools_workers_score_them() -> None:
    # verl's reward loop calls compute_score from several threads at once; short answers are then
    # checked in those threads, and must score exactly as a worker process scores them.
    pairs = []
    for record in load_benchmark("ifeval"):
        constraints = len(record["instruction_id_list"])
        answer = record["prompt"][: verifier.INLINE_MAX_CHECKED_CHARS // constraints]
        try:
            compute_score("ifeval", answer, record)
        except UnsupportedConstraintError:
            continue  # arguments a checker would draw at random: refused for every answer
        assert verifier.checked_in_thread(answer, constraints)
        pairs.append((record, answer))
        if len(pairs) == 64:
            break
    random_state = random.getstate()
    with ThreadPoolExecutor(max_workers=8) as executor:
        threaded = list(executor.map(lambda pair: compute_score("ifeval", pair[1], pair[0]), pairs * 2))
    # Checkers are built with `random` seeded, one at a time: the process's own random state is untouched.
    assert random.getstate() == random_state
    close_shared_pool()
    try:
        pool = shared_pool(verifier.TASKS_MODULE, 2, label="instruction-following")
        for (record, answer), result in zip(pairs * 2, threaded, strict=True):
            truth = {key: record[key] for key in ("instruction_id_list", "kwargs", "prompt")}
            request = {"ground_truth": truth, "response": answer, "max_constraints": MAX_CONSTRAINTS}
            in_pool = pool.call("score", request, 30.0)["scores"]
            assert {key: result[key] for key in in_pool} == in_pool
            assert result["reward/instruction_following/timeouts"] == 0.0
    finally:
        close_shared_pool()

"""An answer whose language langdetect cannot place is counted, not logged.

IFEval's language checkers log ``Unable to detect language for text <the whole answer>`` on the root
logger for every such answer. The instruction-following family drops that record with a filter on the
root logger of each process that loads the checkers (the reward process and the pool's workers) and
reports the case in ``reward/instruction_following/language_undetected`` instead. Real checkers, real
langdetect, the real worker pool.
"""

from __future__ import annotations

import logging

import pytest

from reward_fns import dispatch
from reward_fns.instruction_following import compute_score
from reward_fns.instruction_following.verifier import LANGUAGE_UNDETECTED_KEY, checked_in_thread
from reward_fns.total import MAX_RESPONSE_CHARS

GROUND_TRUTH = {
    "prompt": "Answer in English.",
    "instruction_id_list": ["language:response_language", "change_case:english_lowercase"],
    "kwargs": [{"language": "en"}, {}],
}

#: Digits and punctuation only: langdetect finds no features and raises, IFEval counts the check as followed.
UNDETECTABLE_SHORT = "1234 5678 !!! 42."
UNDETECTABLE_LONG = "1234 5678, 90 -- 42. " * 60
ENGLISH = "this answer is written in plain english, all in lowercase letters, as the instruction asks."


def _score(answer: str) -> dict:
    return compute_score("ifeval", answer, GROUND_TRUTH, timeout_s=30.0)


@pytest.mark.parametrize(
    ("answer", "in_thread"),
    [(UNDETECTABLE_SHORT, True), (UNDETECTABLE_LONG, False)],
    ids=["calling_thread", "worker_pool"],
)
def test_undetected_language_is_counted_and_not_logged(
    answer: str, in_thread: bool, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    assert checked_in_thread(answer, len(GROUND_TRUTH["instruction_id_list"])) is in_thread
    with caplog.at_level(logging.DEBUG):
        result = _score(answer)
    out, err = capfd.readouterr()
    logged = caplog.text + out + err
    assert "Unable to detect language" not in logged, logged[-2000:]
    assert "1234 5678" not in logged, logged[-2000:]
    assert result[LANGUAGE_UNDETECTED_KEY] == 1.0
    # IFEval's rule for an undetected language: the language check counts as followed.
    assert result["if_c0"] == 1.0


def test_detected_language_is_not_counted() -> None:
    result = _score(ENGLISH)
    assert result[LANGUAGE_UNDETECTED_KEY] == 0.0
    assert result["if_c0"] == 1.0 and result["if_c1"] == 1.0


def test_a_response_refused_unread_still_carries_the_counter() -> None:
    result = _score("x" * (MAX_RESPONSE_CHARS + 1))
    assert result["score"] == 0.0
    assert result[LANGUAGE_UNDETECTED_KEY] == 0.0
    assert set(result) == set(_score(ENGLISH))


def test_the_dispatcher_carries_the_counter_for_every_sample() -> None:
    assert LANGUAGE_UNDETECTED_KEY in dispatch.counter_keys()
    assert LANGUAGE_UNDETECTED_KEY not in dispatch.counter_keys(["text_to_sql"])
    undetected = dispatch.compute_score("ifeval", UNDETECTABLE_SHORT, GROUND_TRUTH, timeout_s=30.0)
    english = dispatch.compute_score("ifeval", ENGLISH, GROUND_TRUTH, timeout_s=30.0)
    assert set(undetected) == set(english)
    assert (undetected[LANGUAGE_UNDETECTED_KEY], english[LANGUAGE_UNDETECTED_KEY]) == (1.0, 0.0)


def test_other_root_records_still_pass() -> None:
    """The filter drops the checkers' language record alone."""
    from reward_fns.instruction_following.checkers import UndetectedLanguageFilter

    keep = logging.LogRecord("root", logging.ERROR, __file__, 1, "something else %s", ("x",), None)
    drop = logging.LogRecord("root", logging.ERROR, __file__, 1, "Unable to detect language for text %s", ("x",), None)
    other_logger = logging.LogRecord(
        "eval_framework", logging.ERROR, __file__, 1, "Unable to detect language for text %s", ("x",), None
    )
    language_filter = UndetectedLanguageFilter()
    assert language_filter.filter(keep) and language_filter.filter(other_logger)
    assert not language_filter.filter(drop)

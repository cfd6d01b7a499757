"""compute_score end to end on the bundled Spider dev subset (14 databases, 643 gold queries)."""

from __future__ import annotations

import contextlib
import functools
import json
import re
import shutil
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlglot
from sqlglot import exp

from reward_fns.text_to_sql import BUNDLED_DB_ROOT, DATA_SOURCES, REWARD_KEYS, compute_score
from reward_fns.text_to_sql.verifier import _cached_gold_outcome, clear_gold_cache
from reward_fns.total import RewardConfigError, internal_error_counts

COUNTER_KEYS = {"reward/text_to_sql/internal_errors", "reward/text_to_sql/timeouts"}
EXPECTED_KEYS = {"score", *COUNTER_KEYS, *REWARD_KEYS, *(f"{key}_info" for key in REWARD_KEYS)}


@functools.cache
def dev_examples() -> tuple[dict[str, str], ...]:
    """The 643 Spider dev examples whose databases are bundled."""
    lines = (BUNDLED_DB_ROOT / "dev_subset.jsonl").read_text(encoding="utf-8").splitlines()
    return tuple(json.loads(line) for line in lines)


def as_response(sql: str) -> str:
    """Renders a query the way the policy is asked to answer."""
    return f"The query is:\n```sql\n{sql}\n```"


def ground_truth_of(example: dict[str, str]) -> dict[str, str]:
    return {"sql": example["query"], "db_id": example["db_id"]}


def test_bundled_data_is_complete() -> None:
    examples = dev_examples()
    assert len(examples) == 643
    assert {example["db_id"] for example in examples} == {path.stem for path in BUNDLED_DB_ROOT.glob("*.sqlite")}


def test_every_gold_query_scores_full_marks() -> None:
    failures = []
    for index, example in enumerate(dev_examples()):
        result = compute_score("spider/dev", as_response(example["query"]), ground_truth_of(example))
        if result["score"] != 1.0:
            failures.append((index, example["query"], result["sql_executability_info"]))
    assert failures == []


def test_result_has_the_same_keys_and_types_whatever_happens() -> None:
    ground_truth = {"sql": "SELECT name FROM singer", "db_id": "concert_singer"}
    responses = [
        as_response("SELECT name FROM singer"),
        "no query at all",
        as_response("SELECT nme FROM singer"),
        as_response("SELECT name FROM singer WHERE age > 100"),
        as_response("DELETE FROM singer"),
        "",
    ]
    for response in responses:
        result = compute_score("spider", response, ground_truth)
        assert set(result) == EXPECTED_KEYS
        components = [result[key] for key in REWARD_KEYS]
        assert all(isinstance(value, float) and 0.0 <= value <= 1.0 for value in components)
        assert result["score"] == pytest.approx(sum(components) / 3)  # type: ignore[arg-type]
        assert all(isinstance(result[f"{key}_info"], str) and result[f"{key}_info"] for key in REWARD_KEYS)


def test_package_declares_its_data_sources() -> None:
    assert DATA_SOURCES == ("spider", "bird", "text2sql")
    assert REWARD_KEYS == ("sql_format", "sql_executability", "sql_execution")


# Gold queries with a single '>' where '>=' changes the result (found by running both on the data).
GREATER_THAN_EXAMPLES = [69, 81, 173, 221, 235, 463, 483, 533]


@pytest.mark.parametrize("index", GREATER_THAN_EXAMPLES)
def test_greater_or_equal_instead_of_greater_scores_zero(index: int) -> None:
    example = dev_examples()[index]
    assert example["query"].count(">") == 1
    perturbed = example["query"].replace(">", ">=")
    result = compute_score("spider", as_response(perturbed), ground_truth_of(example))
    assert (result["sql_format"], result["sql_executability"], result["sql_execution"]) == (1.0, 1.0, 0.0)
    info = str(result["sql_execution_info"])
    assert f"Gold SQL: {example['query']}" in info
    assert "Gold result (" in info


def rename_tables(sql: str, suffix: str) -> str:
    """Appends a suffix to every table name of a query (with sqlglot, so aliases and strings stay put)."""
    tree = sqlglot.parse_one(sql, read="sqlite")
    for table in tree.find_all(exp.Table):
        table.set("this", exp.to_identifier(table.name + suffix))
    return tree.sql(dialect="sqlite")


def table_names(db_id: str) -> list[str]:
    """The database's own tables, read with plain sqlite3 (independently of the verifier)."""
    uri = f"{(BUNDLED_DB_ROOT / f'{db_id}.sqlite').as_uri()}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        return [name for (name,) in rows]


def first_example_per_database() -> list[dict[str, str]]:
    firsts: dict[str, dict[str, str]] = {}
    for example in dev_examples():
        firsts.setdefault(example["db_id"], example)
    return list(firsts.values())


@pytest.mark.parametrize("example", first_example_per_database(), ids=lambda example: example["db_id"])
def test_wrong_table_name_is_not_executable_and_the_info_says_why(example: dict[str, str]) -> None:
    perturbed = rename_tables(example["query"], "_typo")
    result = compute_score("spider", as_response(perturbed), ground_truth_of(example))
    assert (result["sql_format"], result["sql_executability"], result["sql_execution"]) == (1.0, 0.0, 0.0)
    info = str(result["sql_executability_info"])
    assert "no such table" in info
    # An unknown table means the model needs the whole schema: every table is listed.
    assert info.startswith("Database schema (all tables):")
    assert info.count("CREATE TABLE") == len(table_names(example["db_id"]))


def test_wrong_column_name_reports_the_error() -> None:
    ground_truth = {"sql": "SELECT name FROM singer", "db_id": "concert_singer"}
    result = compute_score("spider", as_response("SELECT fullname FROM singer"), ground_truth)
    assert result["sql_executability"] == 0.0
    assert "no such column: fullname" in str(result["sql_executability_info"])


def test_executability_info_shows_only_the_tables_the_query_uses() -> None:
    ground_truth = {"sql": "SELECT count(*) FROM singer", "db_id": "concert_singer"}
    result = compute_score("spider", as_response("SELECT count(*) FROM singer"), ground_truth)
    info = str(result["sql_executability_info"])
    assert info.startswith("Schema of the tables the query uses:")
    assert 'CREATE TABLE "singer"' in info
    assert 'CREATE TABLE "stadium"' not in info
    assert info.endswith("Execution: ran without error.")


def test_execution_info_shows_a_truncated_gold_result() -> None:
    ground_truth = {"sql": "SELECT name, population FROM city ORDER BY population DESC", "db_id": "world_1"}
    result = compute_score("spider", as_response("SELECT 1"), ground_truth, info_char_limit=300)
    info = str(result["sql_execution_info"])
    assert info.startswith("Gold SQL: SELECT name, population FROM city ORDER BY population DESC\n")
    assert "Gold result (4079 rows; columns: Name, Population; row order matters):" in info
    assert "('Mumbai (Bombay)', 10500000)" in info
    assert info.endswith("...[truncated]")
    assert len(info) < 500


def test_schema_info_is_truncated_to_the_limit() -> None:
    ground_truth = {"sql": "SELECT count(*) FROM city", "db_id": "world_1"}
    result = compute_score("spider", "no query", ground_truth, info_char_limit=100)
    info = str(result["sql_executability_info"])
    assert "...[truncated]" in info
    assert len(info) < 300


def test_ground_truth_may_be_a_json_string() -> None:
    ground_truth = json.dumps({"sql": "SELECT count(*) FROM singer", "db_id": "concert_singer"})
    assert compute_score("spider", as_response("SELECT count(*) FROM singer"), ground_truth)["score"] == 1.0


@pytest.fixture
def spider_layout_root(tmp_path: Path) -> Path:
    """A database root in Spider's own layout: <root>/<db_id>/<db_id>.sqlite."""
    (tmp_path / "pets_1").mkdir()
    shutil.copyfile(BUNDLED_DB_ROOT / "pets_1.sqlite", tmp_path / "pets_1" / "pets_1.sqlite")
    return tmp_path


def test_db_root_comes_from_extra_info_then_kwarg(spider_layout_root: Path) -> None:
    ground_truth = {"sql": "SELECT count(*) FROM pets", "db_id": "pets_1"}
    response = as_response("SELECT count(*) FROM pets")
    from_extra_info = compute_score("spider", response, ground_truth, {"db_root": str(spider_layout_root)})
    from_kwarg = compute_score("spider", response, ground_truth, None, db_root=spider_layout_root)
    assert from_extra_info["score"] == from_kwarg["score"] == 1.0
    # extra_info wins over the keyword argument.
    with pytest.raises(FileNotFoundError, match="nowhere"):
        compute_score("spider", response, ground_truth, {"db_root": "/nowhere"}, db_root=spider_layout_root)


def test_db_path_may_be_absolute_or_relative_to_the_root(spider_layout_root: Path) -> None:
    response = as_response("SELECT count(*) FROM pets")
    absolute = {"sql": "SELECT count(*) FROM pets", "db_path": str(spider_layout_root / "pets_1" / "pets_1.sqlite")}
    relative = {"sql": "SELECT count(*) FROM pets", "db_path": "pets_1/pets_1.sqlite"}
    assert compute_score("spider", response, absolute)["score"] == 1.0
    assert compute_score("spider", response, relative, {"db_root": str(spider_layout_root)})["score"] == 1.0


def test_missing_database_raises_naming_the_paths(tmp_path: Path) -> None:
    ground_truth = {"sql": "SELECT 1", "db_id": "no_such_db"}
    expected_path = re.escape(str(tmp_path / "no_such_db.sqlite"))
    with pytest.raises(FileNotFoundError, match=expected_path):
        compute_score("spider", as_response("SELECT 1"), ground_truth, {"db_root": str(tmp_path)})


@pytest.mark.parametrize(
    "ground_truth",
    [
        pytest.param("SELECT 1", id="plain-string"),
        pytest.param({"db_id": "concert_singer"}, id="no-sql"),
        pytest.param({"sql": "SELECT 1"}, id="no-db"),
        pytest.param(["SELECT 1", "concert_singer"], id="list"),
    ],
)
def test_malformed_ground_truth_is_a_programmer_error(ground_truth: Any) -> None:
    with pytest.raises(ValueError, match="ground_truth"):
        compute_score("spider", as_response("SELECT 1"), ground_truth)


def test_unknown_semantics_is_a_programmer_error() -> None:
    ground_truth = {"sql": "SELECT 1", "db_id": "singer"}
    with pytest.raises(RewardConfigError, match="semantics"):
        compute_score("spider", as_response("SELECT 1"), ground_truth, semantics="strict")


@pytest.mark.parametrize(
    ("setting", "value"),
    [("isolation", "thread"), ("sandbox_workers", 0), ("sandbox_memory_bytes", "1G"), ("sandbox_workers", True)],
)
def test_refused_sandbox_settings_raise_instead_of_scoring_zero(setting: str, value: Any) -> None:
    # A bad reward_kwargs entry would otherwise score every sample of a run 0 as an "internal error".
    ground_truth = {"sql": "SELECT count(*) FROM singer", "db_id": "singer"}
    before = internal_error_counts().get("text_to_sql", 0)
    with pytest.raises(RewardConfigError, match=setting):
        compute_score("spider", as_response("SELECT count(*) FROM singer"), ground_truth, **{setting: value})
    assert internal_error_counts().get("text_to_sql", 0) == before


def test_reward_loop_keyword_arguments_are_ignored() -> None:
    ground_truth = {"sql": "SELECT count(*) FROM singer", "db_id": "singer"}
    result = compute_score(
        "spider",
        as_response("SELECT count(*) FROM singer"),
        ground_truth,
        reward_router_address=None,
        reward_model_tokenizer=None,
    )
    assert result["score"] == 1.0


def test_a_failing_gold_query_scores_zero_without_raising() -> None:
    ground_truth = {"sql": "SELECT * FROM missing_table", "db_id": "singer"}
    result = compute_score("spider", as_response("SELECT 1"), ground_truth)
    assert (result["sql_format"], result["sql_executability"], result["sql_execution"]) == (1.0, 1.0, 0.0)
    assert "Gold query failed: OperationalError: no such table: missing_table" in str(result["sql_execution_info"])


def test_gold_results_are_cached() -> None:
    clear_gold_cache()
    example = dev_examples()[0]
    for _ in range(3):
        compute_score("spider", as_response(example["query"]), ground_truth_of(example))
    info = _cached_gold_outcome.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_scoring_from_many_threads_agrees_with_scoring_serially() -> None:
    examples = dev_examples()[::5]

    def score(example: dict[str, str]) -> float:
        value = compute_score("spider", as_response(example["query"]), ground_truth_of(example))["score"]
        assert isinstance(value, float)
        return value

    clear_gold_cache()
    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(score, examples)) == [1.0] * len(examples)

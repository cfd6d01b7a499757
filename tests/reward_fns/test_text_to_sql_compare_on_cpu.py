"""Result comparison (Spider bag/ORDER BY semantics, BIRD set semantics) and the sqlglot helpers it relies on."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reward_fns.text_to_sql import compute_score
from reward_fns.text_to_sql.compare import results_match
from reward_fns.text_to_sql.sandbox import QueryResult
from reward_fns.text_to_sql.sql_analysis import query_orders_rows, referenced_table_names


def result(rows: list[tuple[Any, ...]], width: int | None = None) -> QueryResult:
    """Builds a QueryResult with placeholder column names."""
    column_count = width if width is not None else len(rows[0])
    return QueryResult(columns=tuple(f"c{index}" for index in range(column_count)), rows=tuple(rows))


def spider_match(predicted: QueryResult, gold: QueryResult, ordered: bool = False) -> bool:
    return results_match(predicted, gold, semantics="spider", gold_orders_rows=ordered)


def bird_match(predicted: QueryResult, gold: QueryResult) -> bool:
    return results_match(predicted, gold, semantics="bird", gold_orders_rows=False)


GOLD = result([(1, "a"), (2, "b"), (3, "c")])


class TestSpiderSemantics:
    def test_row_order_is_ignored_without_order_by(self) -> None:
        assert spider_match(result([(3, "c"), (1, "a"), (2, "b")]), GOLD, ordered=False)

    def test_row_order_matters_with_order_by(self) -> None:
        assert not spider_match(result([(3, "c"), (1, "a"), (2, "b")]), GOLD, ordered=True)
        assert spider_match(result([(1, "a"), (2, "b"), (3, "c")]), GOLD, ordered=True)

    def test_duplicates_matter(self) -> None:
        gold_with_duplicate = result([(1, "a"), (1, "a"), (2, "b")])
        assert not spider_match(result([(1, "a"), (2, "b"), (2, "b")]), gold_with_duplicate)
        assert not spider_match(result([(1, "a"), (2, "b")]), gold_with_duplicate)
        assert spider_match(result([(2, "b"), (1, "a"), (1, "a")]), gold_with_duplicate)

    def test_column_permutation_is_accepted(self) -> None:
        assert spider_match(result([("b", 2), ("a", 1), ("c", 3)]), GOLD, ordered=False)
        assert spider_match(result([("a", 1), ("b", 2), ("c", 3)]), GOLD, ordered=True)

    def test_column_permutation_must_keep_rows_together(self) -> None:
        # Each column holds the right values, but paired differently.
        assert not spider_match(result([(1, "b"), (2, "a"), (3, "c")]), GOLD)

    def test_columns_with_equal_values_must_still_pair_rows_up(self) -> None:
        gold = result([(1, 1), (2, 2)])
        assert not spider_match(result([(1, 2), (2, 1)]), gold)

    def test_identical_predicted_columns_are_tried_in_every_role(self) -> None:
        gold = result([(1, 1, 2), (2, 2, 1)])
        assert spider_match(result([(2, 1, 1), (1, 2, 2)]), gold)
        assert not spider_match(result([(1, 1, 1), (2, 2, 2)]), gold)

    def test_column_and_row_counts_must_agree(self) -> None:
        assert not spider_match(result([(1,), (2,), (3,)]), GOLD)
        assert not spider_match(result([(1, "a", None), (2, "b", None), (3, "c", None)]), GOLD)
        assert not spider_match(result([(1, "a"), (2, "b")]), GOLD)

    def test_empty_results_match_only_with_the_same_width(self) -> None:
        assert spider_match(result([], width=2), result([], width=2))
        assert not spider_match(result([], width=1), result([], width=2))

    def test_values_compare_with_python_equality(self) -> None:
        assert spider_match(result([(1.0,)]), result([(1,)]))
        assert not spider_match(result([("1",)]), result([(1,)]))
        assert spider_match(result([(None,)]), result([(None,)]))


class TestBirdSemantics:
    def test_duplicates_and_order_are_ignored(self) -> None:
        assert bird_match(result([(3, "c"), (1, "a"), (1, "a"), (2, "b")]), GOLD)

    def test_columns_compare_in_their_order(self) -> None:
        assert not bird_match(result([("a", 1), ("b", 2), ("c", 3)]), GOLD)

    def test_missing_rows_fail(self) -> None:
        assert not bird_match(result([(1, "a"), (2, "b")]), GOLD)


def test_unknown_semantics_is_a_programmer_error() -> None:
    with pytest.raises(ValueError, match="unknown comparison semantics"):
        results_match(GOLD, GOLD, semantics="exact", gold_orders_rows=False)  # type: ignore[arg-type]


cell_values = st.one_of(st.integers(-5, 5), st.text(alphabet="abc", max_size=2), st.none())


@st.composite
def rows_of_one_width(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    width = draw(st.integers(1, 4))
    return draw(st.lists(st.tuples(*[cell_values] * width), min_size=1, max_size=12))


@given(rows=rows_of_one_width(), data=st.data())
def test_spider_bag_comparison_is_invariant_to_row_permutation(
    rows: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    shuffled = data.draw(st.permutations(rows))
    assert spider_match(result(shuffled), result(rows), ordered=False)
    assert bird_match(result(shuffled), result(rows))


@given(rows=rows_of_one_width(), data=st.data())
def test_spider_comparison_is_invariant_to_column_permutation(rows: list[tuple[Any, ...]], data: st.DataObject) -> None:
    column_order = data.draw(st.permutations(range(len(rows[0]))))
    permuted = [tuple(row[index] for index in column_order) for row in rows]
    assert spider_match(result(permuted), result(rows), ordered=False)
    assert spider_match(result(permuted), result(rows), ordered=True)


@given(rows=rows_of_one_width(), data=st.data())
def test_an_extra_duplicate_row_breaks_spider_but_not_bird(rows: list[tuple[Any, ...]], data: st.DataObject) -> None:
    duplicated = [*rows, data.draw(st.sampled_from(rows))]
    assert not spider_match(result(duplicated), result(rows))
    assert bird_match(result(duplicated), result(rows))


@given(values=st.lists(cell_values, min_size=1, max_size=12), data=st.data())
def test_ordered_comparison_of_one_column_is_list_equality(values: list[Any], data: st.DataObject) -> None:
    # One column leaves no column permutation to try, so only the row order decides.
    rows = [(value,) for value in values]
    reordered = data.draw(st.permutations(rows))
    assert spider_match(result(reordered), result(rows), ordered=True) == (reordered == rows)


@pytest.mark.parametrize(
    ("sql", "orders_rows"),
    [
        ("SELECT name FROM singer ORDER BY age DESC", True),
        ("SELECT name FROM singer", False),
        ("SELECT count(*) FROM concert WHERE id = (SELECT id FROM stadium ORDER BY capacity LIMIT 1)", False),
        ("SELECT name FROM singer UNION SELECT name FROM stadium ORDER BY name", True),
        ("WITH ranked AS (SELECT name FROM singer ORDER BY age) SELECT name FROM ranked", False),
        ("SELECT name, rank() OVER (ORDER BY age) FROM singer", False),
        ("SELECT name FROM singer -- ORDER BY age", False),
        ("SELECT name FROM singer WHERE note = 'order by'", False),
    ],
)  # fmt: skip
def test_order_by_detection_looks_only_at_the_outermost_select(sql: str, orders_rows: bool) -> None:
    assert query_orders_rows(sql) is orders_rows


def test_referenced_tables_leave_out_cte_names() -> None:
    sql = "WITH old AS (SELECT * FROM Singer) SELECT * FROM old JOIN concert ON 1"
    assert referenced_table_names(sql) == {"singer", "concert"}
    assert referenced_table_names("SELECT FROM WHERE (") is None


class TestOnSpiderData:
    """The same rules, end to end on the bundled concert_singer database."""

    SINGERS_BY_AGE: ClassVar[dict[str, str]] = {
        "sql": "SELECT name, country, age FROM singer ORDER BY age DESC",
        "db_id": "concert_singer",
    }
    SINGER_NAMES: ClassVar[dict[str, str]] = {"sql": "SELECT name FROM singer", "db_id": "concert_singer"}

    def score(self, sql: str, ground_truth: dict[str, str], data_source: str = "spider") -> float:
        value = compute_score(data_source, f"```sql\n{sql}\n```", ground_truth)["sql_execution"]
        assert isinstance(value, float)
        return value

    def test_reversed_order_fails_when_gold_orders(self) -> None:
        assert self.score("SELECT name, country, age FROM singer ORDER BY age ASC", self.SINGERS_BY_AGE) == 0.0

    def test_permuted_columns_pass(self) -> None:
        assert self.score("SELECT age, name, country FROM singer ORDER BY age DESC", self.SINGERS_BY_AGE) == 1.0

    def test_any_order_passes_when_gold_does_not_order(self) -> None:
        assert self.score("SELECT name FROM singer ORDER BY name DESC", self.SINGER_NAMES) == 1.0

    def test_duplicated_rows_fail_under_spider_but_pass_under_bird(self) -> None:
        doubled = "SELECT name FROM singer UNION ALL SELECT name FROM singer"
        assert self.score(doubled, self.SINGER_NAMES) == 0.0
        assert self.score(doubled, self.SINGER_NAMES, data_source="bird/dev") == 1.0
        semantics_override = compute_score("bird", f"```sql\n{doubled}\n```", self.SINGER_NAMES, semantics="spider")
        assert semantics_override["sql_execution"] == 0.0

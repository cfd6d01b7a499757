"""Decides whether a predicted query's result equals the gold result.

Two rules are offered:

* ``"spider"`` (default), the rule of Spider's execution accuracy: the results
  must have the same number of columns and rows; rows are compared as a bag
  (multiset: order ignored, duplicates counted) unless the gold query has an
  ORDER BY on its outermost SELECT, in which case the row order must match too;
  the predicted columns may come in any order (some permutation of them must
  match). Unlike Spider's script, two empty results match only when their
  column counts agree as well.
* ``"bird"``, the rule of BIRD's evaluation script: the *sets* of rows must be
  equal (duplicates and row order ignored), columns compared in their order.

Values compare with Python equality, as in both official scripts (so 1 == 1.0,
but 1 != '1').
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from reward_fns.text_to_sql.sandbox import QueryResult

Semantics = Literal["spider", "bird"]
SEMANTICS: tuple[Semantics, ...] = ("spider", "bird")

# Column orders tried before giving up under Spider semantics. Identical columns
# are tried once, so only results with many same-valued but differently arranged
# columns can reach it; past it the results count as different.
MAX_COLUMN_ORDERS_TRIED = 1_000

Row = tuple[Any, ...]


def results_match(predicted: QueryResult, gold: QueryResult, *, semantics: Semantics, gold_orders_rows: bool) -> bool:
    """Compares a predicted result with the gold result.

    Args:
        predicted: The result of the predicted query.
        gold: The result of the gold query.
        semantics: "spider" (bag of rows, column permutation allowed) or "bird" (set of rows).
        gold_orders_rows: Whether the gold query's outermost SELECT has an ORDER BY
            (only used by Spider semantics).

    Returns:
        True when the results count as equal.

    Raises:
        ValueError: If `semantics` is not one of `SEMANTICS`.
    """
    if semantics == "spider":
        return spider_results_match(predicted, gold, order_matters=gold_orders_rows)
    if semantics == "bird":
        return bird_results_match(predicted, gold)
    raise ValueError(f"unknown comparison semantics {semantics!r}; expected one of {SEMANTICS}")


def bird_results_match(predicted: QueryResult, gold: QueryResult) -> bool:
    """BIRD's rule: the sets of rows are equal.

    Args:
        predicted: The result of the predicted query.
        gold: The result of the gold query.

    Returns:
        True when both results hold the same distinct rows.
    """
    return set(predicted.rows) == set(gold.rows)


def spider_results_match(predicted: QueryResult, gold: QueryResult, *, order_matters: bool) -> bool:
    """Spider's rule: equal bags (or lists) of rows under some order of the predicted columns.

    Args:
        predicted: The result of the predicted query.
        gold: The result of the gold query.
        order_matters: Compare rows as lists (True) or as multisets (False).

    Returns:
        True when some column order of `predicted` makes its rows equal to `gold`'s.
    """
    width = len(gold.columns)
    if len(predicted.columns) != width or len(predicted.rows) != len(gold.rows):
        return False
    if not gold.rows:
        return True
    gold_rows = list(gold.rows) if order_matters else Counter(gold.rows)
    for tried, column_order in enumerate(_plausible_column_orders(predicted.rows, gold.rows, order_matters)):
        if tried >= MAX_COLUMN_ORDERS_TRIED:
            return False
        reordered = [tuple(row[column] for column in column_order) for row in predicted.rows]
        if (reordered if order_matters else Counter(reordered)) == gold_rows:
            return True
    return False


def _plausible_column_orders(
    predicted_rows: Sequence[Row], gold_rows: Sequence[Row], order_matters: bool
) -> Iterator[tuple[int, ...]]:
    """Yields orders of the predicted columns under which each column could equal its gold column.

    A predicted column can stand for a gold column only if it holds the same
    values (the same list when order matters, else the same multiset), which
    prunes almost every permutation. Identical predicted columns are
    interchangeable, so only one arrangement of them is yielded.

    Args:
        predicted_rows: Non-empty predicted rows.
        gold_rows: Gold rows, as many as `predicted_rows` and of the same width.
        order_matters: Whether columns are compared as lists or as multisets.

    Yields:
        Tuples `order` such that `tuple(row[i] for i in order)` lines predicted rows up with gold columns.
    """
    predicted_columns = list(zip(*predicted_rows, strict=True))
    gold_columns = list(zip(*gold_rows, strict=True))
    width = len(gold_columns)

    def signature(column: tuple[Any, ...]) -> tuple[Any, ...] | Counter[Any]:
        return column if order_matters else Counter(column)

    predicted_signatures = [signature(column) for column in predicted_columns]
    candidates = [
        [index for index, candidate in enumerate(predicted_signatures) if candidate == signature(gold_column)]
        for gold_column in gold_columns
    ]
    earlier_twins = [
        [other for other in range(index) if predicted_columns[other] == predicted_columns[index]]
        for index in range(width)
    ]
    chosen: list[int] = []
    used: set[int] = set()

    def extend(gold_index: int) -> Iterator[tuple[int, ...]]:
        if gold_index == width:
            yield tuple(chosen)
            return
        for index in candidates[gold_index]:
            # Use an identical column only after all its earlier twins: one arrangement suffices.
            if index in used or any(twin not in used for twin in earlier_twins[index]):
                continue
            chosen.append(index)
            used.add(index)
            yield from extend(gold_index + 1)
            chosen.pop()
            used.remove(index)

    yield from extend(0)

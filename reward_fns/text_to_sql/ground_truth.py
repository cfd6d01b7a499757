"""Reads a text-to-SQL ground truth and finds its database file.

Ground-truth schema: a dict, or a JSON string of one, with

* ``"sql"`` (str, required): the gold query;
* ``"db_id"`` (str, required unless ``db_path`` is given): the database name;
* ``"db_path"`` (str, optional): the SQLite file. A relative path is taken
  relative to the database root.

Without ``db_path`` the file is ``<db_root>/<db_id>.sqlite`` or, Spider's own
layout, ``<db_root>/<db_id>/<db_id>.sqlite``. The database root is, first found:
``extra_info["db_root"]``, the ``db_root`` keyword argument, the Spider dev
subset bundled with this package (`BUNDLED_DB_ROOT`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUNDLED_DB_ROOT = Path(__file__).resolve().parent.parent / "data" / "spider"


@dataclass(frozen=True)
class GoldQuery:
    """A gold query and the database it runs on.

    Attributes:
        sql: The gold SQL.
        db_path: Absolute path of the SQLite file (checked to exist).
    """

    sql: str
    db_path: Path


def _as_mapping(ground_truth: Any) -> Mapping[str, Any]:
    """Accepts a mapping or a JSON object string; anything else is a data error."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as error:
            raise ValueError(f"text-to-SQL ground_truth is a string but not JSON: {error}") from error
    if not isinstance(ground_truth, Mapping):
        raise ValueError(
            'text-to-SQL ground_truth must be a dict (or JSON string) like {"sql": ..., "db_id": ...}; '
            f"got {type(ground_truth).__name__}"
        )
    return ground_truth


def _required_text(fields: Mapping[str, Any], key: str) -> str:
    """Returns a non-empty string field or raises a ValueError naming it."""
    value = fields.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"text-to-SQL ground_truth needs a non-empty string {key!r}; got {value!r}")
    return value


def choose_db_root(extra_info: Mapping[str, Any] | None, db_root: str | Path | None) -> Path:
    """Picks the database root: extra_info["db_root"], then the keyword argument, then the bundled data.

    Args:
        extra_info: The sample's extra_info (may be None).
        db_root: The `db_root` keyword argument (may be None).

    Returns:
        The root folder.
    """
    from_sample = (extra_info or {}).get("db_root")
    for root in (from_sample, db_root):
        if root:
            return Path(root)
    return BUNDLED_DB_ROOT


def resolve_gold_query(ground_truth: Any, db_root: Path) -> GoldQuery:
    """Parses a ground truth and locates its database file.

    Args:
        ground_truth: A dict or JSON string following the schema in this module's docstring.
        db_root: The database root folder.

    Returns:
        The gold query with the database's absolute path.

    Raises:
        ValueError: If the ground truth is malformed.
        FileNotFoundError: If no database file exists; the message names every path tried.
    """
    fields = _as_mapping(ground_truth)
    sql = _required_text(fields, "sql")
    if fields.get("db_path"):
        candidates = [db_root / Path(_required_text(fields, "db_path"))]  # an absolute path replaces db_root
    else:
        db_id = _required_text(fields, "db_id")
        candidates = [db_root / f"{db_id}.sqlite", db_root / db_id / f"{db_id}.sqlite"]
    for candidate in candidates:
        if candidate.is_file():
            return GoldQuery(sql=sql, db_path=candidate.resolve())
    tried = ", ".join(str(candidate) for candidate in candidates)
    raise FileNotFoundError(f"text-to-SQL database file not found; tried: {tried}")

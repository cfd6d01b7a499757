"""Text-to-SQL prompts in verl's RL parquet, for the ``text_to_sql`` verifier.

Sources (pick one):

* default: the Spider dev subset bundled with ``reward_fns`` (643 questions on 14 databases),
  split at random by question (``--test-fraction``);
* ``--spider-dir DIR``: a Spider release (``train_spider.json`` [+ ``train_others.json``] → train,
  ``dev.json`` → test, databases in ``DIR/database/<db_id>/<db_id>.sqlite``);
* ``--bird-dir DIR``: a BIRD release (``DIR/train/train.json`` with ``DIR/train/train_databases``
  → train, ``DIR/dev/dev.json`` with ``DIR/dev/dev_databases`` → test); the question's
  ``evidence`` is shown as a hint, and ``data_source=bird`` selects BIRD's set comparison.

Each prompt holds the database's ``CREATE`` statements and the question and asks for one ```sql
block. The ground truth is ``{"sql", "db_id"}``; for a user-given release the rows also carry
``extra_info.db_root`` (absolute), which the verifier prefers, so that folder must exist on every
node that scores rewards.

Example::

    python recipes/data/prepare_text_to_sql.py --spider-dir ~/datasets/spider
"""

from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_parquet import argument_parser, random_split, readable, rl_row, shuffled, write_splits

from reward_fns.ground_truths import validate_row
from reward_fns.text_to_sql import BUNDLED_DB_ROOT, EXPECTED_FORMAT

ABILITY = "text_to_sql"
BUNDLED_QUESTIONS = BUNDLED_DB_ROOT / "dev_subset.jsonl"


@dataclass(frozen=True)
class Question:
    """One text-to-SQL example and where its database lives (``source``: its file and position)."""

    db_id: str
    question: str
    sql: str
    db_root: Path
    hint: str = ""
    source: str = ""


@functools.cache
def schema_text(db_path: Path) -> str:
    """The database's ``CREATE TABLE`` statements, as SQLite stores them (read-only)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as connection:
        rows = connection.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid"
        ).fetchall()
    return ";\n\n".join(sql.strip() for (sql,) in rows) + ";"


def database_path(db_root: Path, db_id: str) -> Path:
    """``<root>/<db_id>.sqlite`` (bundled layout) or ``<root>/<db_id>/<db_id>.sqlite`` (Spider, BIRD)."""
    for candidate in (db_root / f"{db_id}.sqlite", db_root / db_id / f"{db_id}.sqlite"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no SQLite file for database {db_id!r} under {db_root}")


def messages_for(item: Question) -> list[dict[str, str]]:
    """The chat prompt: schema, question, optional hint and the answer format."""
    hint = f"\nHint: {item.hint}" if item.hint else ""
    content = (
        "You are given an SQLite database and a question about its data.\n\n"
        f"Database schema:\n{schema_text(database_path(item.db_root, item.db_id))}\n\n"
        f"Question: {item.question}{hint}\n\n"
        "Write one SQLite query that answers the question. You may reason briefly first.\n"
        f"Answer format: {EXPECTED_FORMAT}"
    )
    return [{"role": "user", "content": content}]


def read_examples(path: Path, db_root: Path) -> list[Question]:
    """Spider (``query``) or BIRD (``SQL``, ``evidence``) examples from a JSON or JSON-lines file."""
    text = path.read_text(encoding="utf-8")
    records = json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines() if line]
    # Missing fields are left empty here, so that the verifier's reader refuses the row by name.
    return [
        Question(
            db_id=str(record.get("db_id") or ""),
            question=str(record.get("question") or "").strip(),
            sql=str(record.get("query") or record.get("SQL") or ""),
            db_root=db_root,
            hint=str(record.get("evidence") or "").strip(),
            source=f"{path.name} record {position}",
        )
        for position, record in enumerate(records)
    ]


def spider_release(spider_dir: Path) -> dict[str, list[Question]]:
    """Spider's own train/dev split."""
    db_root = spider_dir.resolve() / "database"
    train_files = [spider_dir / "train_spider.json", spider_dir / "train_others.json"]
    train = [q for path in train_files if path.is_file() for q in read_examples(path, db_root)]
    return {"train": train, "test": read_examples(spider_dir / "dev.json", db_root)}


def bird_release(bird_dir: Path) -> dict[str, list[Question]]:
    """BIRD's own train/dev split, each with its database folder."""
    root = bird_dir.resolve()
    return {
        "train": read_examples(root / "train" / "train.json", root / "train" / "train_databases"),
        "test": read_examples(root / "dev" / "dev.json", root / "dev" / "dev_databases"),
    }


def check(item: Question, data_source: str) -> None:
    """The verifier's own reader on this example's ground truth (database found, fields present)."""
    validate_row(
        data_source, {"sql": item.sql, "db_id": item.db_id}, {"db_root": str(item.db_root), "index": item.source}
    )


def to_row(item: Question, data_source: str, bundled: bool) -> dict[str, Any]:
    extra_info: dict[str, Any] = {"db_id": item.db_id, "question": item.question}
    if not bundled:  # the bundled databases are found by the verifier without a path
        extra_info["db_root"] = str(item.db_root)
    return rl_row(
        data_source=data_source,
        messages=messages_for(item),
        ability=ABILITY,
        ground_truth={"sql": item.sql, "db_id": item.db_id},
        extra_info=extra_info,
    )


def main() -> None:
    parser = argument_parser("text_to_sql", __doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--spider-dir", type=Path, help="a Spider release folder (default: the bundled subset)")
    source.add_argument("--bird-dir", type=Path, help="a BIRD release folder with train/ and dev/")
    parser.add_argument("--test-fraction", type=float, default=0.1, help="bundled subset only: share held out")
    args = parser.parse_args()

    if args.spider_dir:
        splits, data_source = spider_release(args.spider_dir), "spider"
    elif args.bird_dir:
        splits, data_source = bird_release(args.bird_dir), "bird"
    else:
        bundled = read_examples(BUNDLED_QUESTIONS, BUNDLED_DB_ROOT)
        splits, data_source = random_split(bundled, args.test_fraction, args.seed), "spider"
    bundled_source = not (args.spider_dir or args.bird_dir)
    rows = {
        split: [
            to_row(item, data_source, bundled_source)
            for item in readable(
                shuffled(items, args.seed),
                lambda item: check(item, data_source),
                lambda item: f"{item.source} (db_id={item.db_id!r}, question={item.question[:60]!r})",
                args.drop_unreadable,
            )
        ]
        for split, items in splits.items()
    }
    write_splits(args.output_dir, rows, args.max_samples)


if __name__ == "__main__":
    main()

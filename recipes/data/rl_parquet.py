"""What the three data-preparation scripts share: the command line, the split and verl's RL parquet.

verl's RL dataset (``verl.utils.dataset.rl_dataset.RLHFDataset``, verl 0.9.1) reads one row per
prompt with these columns:

* ``data_source`` (str): routes the row to a verifier (``reward_fns.dispatch.family_for``);
* ``prompt`` (list of ``{"role", "content"}``): the chat messages, rendered with the model's template;
* ``ability`` (str): a free task label;
* ``reward_model`` (``{"style": "rule", "ground_truth": str}``): the verifier's ground truth, as JSON;
* ``extra_info`` (dict): ``split``, ``index`` and anything the verifier or a reader wants.

Every row's ground truth is read by the verifier's own reader before anything is written
(``reward_fns.ground_truths.validate_row``, the code the reward runs): a row it cannot read stops
the script with the row named, or, with ``--drop-unreadable``, is dropped and counted.

Imported by sibling scripts run as ``python recipes/data/prepare_<task>.py`` (the script's folder
is on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from reward_fns.total import GroundTruthError

Item = TypeVar("Item")
_DROPPED_SHOWN = 10

SPLITS = ("train", "test")


def argument_parser(task: str, description: str) -> argparse.ArgumentParser:
    """The options every script has: ``--output-dir``, ``--max-samples``, ``--seed``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path.home() / "data" / "mrtpo" / task,
        help="where train.parquet and test.parquet go (default: %(default)s)",
    )
    parser.add_argument(
        "--max-samples", type=int, default=None, help="keep at most this many rows per split (default: all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle and of random splits")
    parser.add_argument(
        "--drop-unreadable",
        action="store_true",
        help="drop (and count) rows whose ground truth the verifier cannot read, instead of stopping",
    )
    return parser


def readable(
    items: Sequence[Item], check: Callable[[Item], None], name: Callable[[Item], str], drop_unreadable: bool
) -> list[Item]:
    """The items whose ground truth the verifier reads; the others stop the script or are dropped.

    Args:
        items: candidate rows (or what they are built from).
        check: raises ``GroundTruthError`` for an unreadable item (``reward_fns.ground_truths.validate_row``).
        name: how an item is named in messages (an id, a file position).
        drop_unreadable: drop and count instead of stopping.

    Returns:
        The readable items, in order.

    Raises:
        SystemExit: an item is unreadable and ``drop_unreadable`` is false; the message names it.
    """
    kept, dropped = [], []
    for item in items:
        try:
            check(item)
        except GroundTruthError as error:
            if not drop_unreadable:
                raise SystemExit(
                    f"refusing {name(item)}: {error}\n(--drop-unreadable drops such rows and counts them)"
                ) from error
            dropped.append(f"{name(item)}: {error}")
            continue
        kept.append(item)
    if dropped:
        print(f"dropped {len(dropped)} rows whose ground truth cannot be read:")
        for line in dropped[:_DROPPED_SHOWN]:
            print(f"  {line}")
        if len(dropped) > _DROPPED_SHOWN:
            print(f"  ... and {len(dropped) - _DROPPED_SHOWN} more")
    return kept


def random_split(items: Sequence[Any], test_fraction: float, seed: int) -> dict[str, list[Any]]:
    """Shuffle with ``seed`` and cut off a test part; the test part keeps ≥ 1 item when there are ≥ 2."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    shuffled = list(items)
    random.Random(seed).shuffle(shuffled)
    n_test = max(1, round(len(shuffled) * test_fraction)) if len(shuffled) >= 2 else 0
    return {"train": shuffled[n_test:], "test": shuffled[:n_test]}


def shuffled(items: Sequence[Any], seed: int) -> list[Any]:
    """A seeded shuffle, so that ``--max-samples`` takes a random subset rather than the file's head."""
    result = list(items)
    random.Random(seed).shuffle(result)
    return result


def rl_row(
    *,
    data_source: str,
    messages: list[dict[str, str]],
    ability: str,
    ground_truth: Mapping[str, Any],
    extra_info: Mapping[str, Any],
) -> dict[str, Any]:
    """One row of verl's RL parquet; ``split`` and ``index`` are added by :func:`write_splits`.

    The ground truth is stored as a JSON string: verifiers accept it, and a string column keeps
    ragged nested data (BFCL answers, IFEval kwargs) out of parquet's struct inference.
    """
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(ground_truth, ensure_ascii=False)},
        "extra_info": dict(extra_info),
    }


def write_splits(output_dir: Path, rows_by_split: Mapping[str, list[dict[str, Any]]], max_samples: int | None) -> None:
    """Write ``<split>.parquet`` for every split, numbering rows and capping them at ``max_samples``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in rows_by_split.items():
        kept = rows if max_samples is None else rows[:max_samples]
        if not kept:
            raise SystemExit(f"no {split} rows to write; check the input data and --max-samples")
        for index, row in enumerate(kept):
            row["extra_info"] = {"split": split, "index": index, **row["extra_info"]}
        path = output_dir / f"{split}.parquet"
        pd.DataFrame(kept).to_parquet(path, index=False)
        print(f"wrote {len(kept)} rows to {path}")

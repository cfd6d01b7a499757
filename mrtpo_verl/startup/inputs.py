"""The dry run's checks of what a run reads: data files, model, tokenizer, reward function, columns.

Everything here is read the cheap way, without Ray and without model weights: parquet metadata and
a few rows (``pyarrow``), the model's ``config.json`` and tokenizer (``transformers``), the reward
function's module (verl's own loader). Each problem is a :class:`~mrtpo_verl.startup.mistakes.ConfigMistake`
that names the config field, the value and the fix.

Columns, as verl 0.9.1 reads them: ``data.prompt_key`` (the chat messages) and ``data.reward_fn_key``
(``data_source``, handed to the reward function) in every file; with our reward function
(``pkg://reward_fns.dispatch``) also ``reward_model.ground_truth``, every ``data_source`` served by
one of the configured families, and the first rows' ground truths readable by the verifier's own
reader (``reward_fns.ground_truths.validate_row``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.startup.mistakes import ConfigMistake
from mrtpo_verl.startup.reads import RunReads

__all__ = ["check_run_inputs"]

#: Rows whose ground truth is read through the verifier in each file (plus the first of each data_source).
SAMPLE_ROWS = 4
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def check_run_inputs(config: DictConfig, reads: RunReads | None = None) -> None:
    """Data files, model and tokenizer, reward function; raise :class:`ConfigMistake` on the first problem.

    ``reads`` holds what the other start-up checks already read (the model config); a fresh one when None.
    """
    check_model(config, reads or RunReads())
    reward = _reward_function(config)
    for field in ("data.train_files", "data.val_files"):
        for path in _files(config, field):
            check_data_file(config, field, path, reward)


def _files(config: DictConfig, field: str) -> list[str]:
    value = OmegaConf.select(config, field, default=None)
    if value is None or value == "":
        raise ConfigMistake(f"{field}: not set (allowed: a parquet file or a list of them)")
    if isinstance(value, str):
        return [value]
    return [str(v) for v in OmegaConf.to_container(value, resolve=True)]  # type: ignore[union-attr]


#: verl's RLHFDataset reads these besides parquet (with the datasets library's "json" loader).
JSON_SUFFIXES = (".json", ".jsonl")


def _json_as_parquet(path: Path) -> Any:
    """A JSON (array or lines) data file as an in-memory ``ParquetFile``, so that one set of checks reads both."""
    import io
    import json

    import pyarrow as pa
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq

    try:
        table = pa_json.read_json(path)  # JSON lines
    except pa.ArrowInvalid:
        records = json.loads(path.read_text(encoding="utf-8"))  # one JSON array of records
        if not isinstance(records, list):
            raise ValueError("expected JSON lines or one JSON array of records") from None
        table = pa.Table.from_pylist(records)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return pq.ParquetFile(pa.BufferReader(buffer.getvalue()))


def _remote(path: str) -> bool:
    return "://" in path  # hdfs://, s3://: verl copies them at start-up; nothing to check locally


def check_model(config: DictConfig, reads: RunReads | None = None) -> None:
    """``actor_rollout_ref.model.path``: config.json, weights and tokenizer, as verl will load them."""
    model = config.actor_rollout_ref.model
    path = str(model.path)
    trust = bool(OmegaConf.select(model, "trust_remote_code", default=False))
    if not _remote(path):
        _check_model_folder("actor_rollout_ref.model.path", path, trust, reads or RunReads())
    tokenizer_path = OmegaConf.select(model, "tokenizer_path", default=None)
    field = "actor_rollout_ref.model.tokenizer_path" if tokenizer_path else "actor_rollout_ref.model.path"
    source = str(tokenizer_path or path)
    if _remote(source):
        return
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(_local_or_hub(field, source), trust_remote_code=trust)
    except Exception as error:  # transformers raises many types for a missing/broken tokenizer
        raise ConfigMistake(
            f"{field}: no tokenizer can be loaded from {source!r} ({_short(error)}); point it to a model folder "
            "with tokenizer files (tokenizer.json / tokenizer_config.json)"
        ) from error


def _local_or_hub(field: str, path: str) -> str:
    """The path to load from: an existing local folder, or a Hugging Face id (checked by loading)."""
    local = Path(path).expanduser()
    if local.exists():
        return str(local)
    if HUB_ID.match(path) and not path.startswith(("./", "../")):
        return path
    raise ConfigMistake(f"{field}: {path!r} does not exist (allowed: a local model folder or a Hugging Face id)")


def _check_model_folder(field: str, path: str, trust: bool, reads: RunReads) -> None:
    source = _local_or_hub(field, path)
    try:
        reads.model_config(source, trust)
    except Exception as error:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        where = "in the local Hugging Face cache (HF_HUB_OFFLINE=1) " if offline and source == path else ""
        raise ConfigMistake(
            f"{field}: {path!r} has no readable model config {where}({_short(error)}); give a local model "
            "folder with config.json, or download the model first (huggingface-cli download <id>)"
        ) from error
    folder = Path(source)
    if folder.is_dir() and not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ConfigMistake(
            f"{field}: {path!r} has a config.json but no weight files ({', '.join(WEIGHT_PATTERNS)}); "
            "copy the whole model folder"
        )


def _reward_function(config: DictConfig) -> dict[str, Any] | None:
    """Load the custom reward function as verl will; → its settings, or None when verl's default is used."""
    custom = OmegaConf.select(config, "reward.custom_reward_function", default=None)
    if custom is None or not custom.get("path"):
        return None
    from verl.utils.import_utils import load_extern_object

    path, name = str(custom.path), str(custom.get("name") or "compute_score")
    try:
        load_extern_object(module_path=path, object_name=name)
    except Exception as error:
        raise ConfigMistake(
            f"reward.custom_reward_function: {name!r} from {path!r} cannot be loaded ({_short(error)}); "
            "give path=pkg://<module> or a .py file, and name=<function in it>"
        ) from error
    return dict(OmegaConf.to_container(custom, resolve=True))  # type: ignore[arg-type]


def check_data_file(config: DictConfig, field: str, path: str, reward: dict[str, Any] | None) -> None:
    """One data file: exists, parquet (or JSON, as verl reads), has rows and the columns verl and the reward reads."""
    if _remote(path):
        return
    import pyarrow.parquet as pq

    local = Path(path).expanduser()
    if not local.is_file():
        hint = " (a folder: give the .parquet file inside it)" if local.is_dir() else ""
        raise ConfigMistake(
            f"{field}: {path!r} does not exist{hint}; prepare the data first (recipes/data/prepare_<task>.py) "
            "or point the field to a parquet file"
        )
    try:
        parquet = pq.ParquetFile(local) if local.suffix not in JSON_SUFFIXES else _json_as_parquet(local)
    except Exception as error:  # pyarrow: ArrowInvalid, OSError, PermissionError, ...
        kind = "JSON" if local.suffix in JSON_SUFFIXES else "parquet"
        raise ConfigMistake(f"{field}: {path!r} is not a readable {kind} file ({_short(error)})") from error
    if parquet.metadata.num_rows == 0:
        raise ConfigMistake(f"{field}: {path!r} has no rows")
    columns = parquet.schema_arrow.names
    prompt_key = str(OmegaConf.select(config, "data.prompt_key", default="prompt"))
    source_key = str(OmegaConf.select(config, "data.reward_fn_key", default="data_source"))
    for key, setting in ((prompt_key, "data.prompt_key"), (source_key, "data.reward_fn_key")):
        if key not in columns:
            raise ConfigMistake(
                f"{field}: {path!r} has no column {key!r} ({setting}); columns: {columns}; set {setting} to the "
                "right column or prepare the data with recipes/data/prepare_<task>.py"
            )
    from mrtpo_verl.startup.run_config import REWARD_DISPATCH_PATH

    if reward is not None and reward.get("path") == REWARD_DISPATCH_PATH:
        _check_our_reward_columns(field, path, parquet, columns, source_key, reward)


def _check_our_reward_columns(
    field: str, path: str, parquet: Any, columns: list[str], source_key: str, reward: dict[str, Any]
) -> None:
    """reward_fns.dispatch reads ``reward_model.ground_truth`` and routes rows by data_source to a family."""
    from reward_fns import dispatch
    from reward_fns.ground_truths import validate_row

    schema = parquet.schema_arrow
    has_truth = "reward_model" in columns and _struct_has(schema.field("reward_model").type, "ground_truth")
    if not has_truth:
        raise ConfigMistake(
            f"{field}: {path!r} has no reward_model.ground_truth column, which reward_fns.dispatch reads for every "
            f"row; columns: {columns}; prepare the data with recipes/data/prepare_<task>.py"
        )
    kwargs = dict(reward.get("reward_kwargs") or {})
    families = kwargs.pop("families", None)
    sources = parquet.read(columns=[source_key]).column(source_key).to_pylist()
    first_of_source: dict[str, int] = {}
    for row, source in enumerate(sources):
        first_of_source.setdefault(str(source), row)
    for source, row in first_of_source.items():
        try:
            dispatch.family_for(source, families)
        except ValueError as error:
            raise ConfigMistake(
                f"{field}: row {row} of {path!r} has {source_key}={source!r}, which no configured reward family "
                f"serves (reward.custom_reward_function.reward_kwargs.families={families}): {_short(error)}"
            ) from error
    wanted = set(range(min(SAMPLE_ROWS, len(sources)))) | set(first_of_source.values())
    for row, record in _rows(parquet, [c for c in (source_key, "reward_model", "extra_info") if c in columns], wanted):
        try:
            validate_row(record[source_key], record["reward_model"]["ground_truth"], record.get("extra_info"), **kwargs)
        except Exception as error:  # GroundTruthError and the readers' own errors
            raise ConfigMistake(
                f"{field}: row {row} of {path!r} has a ground truth the verifier cannot read ({_short(error)}); "
                "re-run recipes/data/prepare_<task>.py (it drops or names such rows)"
            ) from error


def _rows(parquet: Any, columns: list[str], wanted: set[int]) -> list[tuple[int, dict[str, Any]]]:
    """The wanted rows (index, record), read in batches so that a large file is never held whole."""
    found: list[tuple[int, dict[str, Any]]] = []
    start = 0
    for batch in parquet.iter_batches(batch_size=256, columns=columns):
        records = batch.to_pylist()
        found += [(row, records[row - start]) for row in sorted(wanted) if start <= row < start + len(records)]
        start += len(records)
        if start > max(wanted):
            break
    return found


def _struct_has(arrow_type: Any, name: str) -> bool:
    import pyarrow as pa

    return pa.types.is_struct(arrow_type) and arrow_type.get_field_index(name) >= 0


def _short(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"

"""What the start-up checks read from disk, read once per check and handed to every check that needs it.

The actor model's ``config.json`` is needed twice: for the replay's token budget (its maximum position,
:mod:`mrtpo_verl.startup.lengths`) and, in a dry run, for the model check of :mod:`mrtpo_verl.startup.inputs`.
:class:`RunReads` reads it once; a failed read is kept and raised again, so each check words its own message
from the same error without a second attempt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["RunReads"]


@dataclass
class RunReads:
    """The reads of one start-up check: model configs by (path, trust_remote_code)."""

    _model_configs: dict[tuple[str, bool], Any] = field(default_factory=dict)

    def model_config(self, path: str, trust_remote_code: bool = False) -> Any:
        """``transformers.AutoConfig`` of a model folder, a Hugging Face id or a single ``.gguf`` file (no weights).

        Raises:
            Exception: what ``AutoConfig.from_pretrained`` raised, the same object on every call for that path.
        """
        local = Path(str(path)).expanduser()
        key = (str(local) if local.exists() else str(path), bool(trust_remote_code))
        if key not in self._model_configs:
            try:
                self._model_configs[key] = _read_model_config(key[0], local, key[1])
            except Exception as error:  # kept: the caller decides whether it is a warning or a mistake
                self._model_configs[key] = error
        found = self._model_configs[key]
        if isinstance(found, Exception):
            raise found
        return found

    @property
    def model_config_reads(self) -> int:
        """How many distinct model configs were read (or tried)."""
        return len(self._model_configs)


def _read_model_config(source: str, local: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    if local.is_file() and local.suffix == ".gguf":  # a single GGUF file: its metadata holds the config
        return AutoConfig.from_pretrained(str(local.parent), gguf_file=local.name)
    return AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)

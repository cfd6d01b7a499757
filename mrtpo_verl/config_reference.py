"""The ``mrtpo:`` block's reference page, generated from the config dataclasses.

``python -m mrtpo_verl.config_reference > docs/configuration.md`` writes it; ``--check FILE`` exits 1 when
FILE differs from what the dataclasses give now. Every column comes from the code that reads the block:

* field, type and dataclass default: ``dataclasses.fields`` of :class:`~mrtpo_verl.config.MRTPOConfig` and
  :class:`~mrtpo_verl.config.ReplayConfig` (``mrtpo.replay.*``);
* default as shipped: the value in ``mrtpo_verl/configs/mrtpo_trainer.yaml`` (which must equal the dataclass
  default unless it is an interpolation such as ``${actor_rollout_ref.rollout.temperature}``);
* allowed values: the validator's own ``(allowed: …)`` text, found by handing each field a value it refuses;
* meaning: the yaml's comment above the field.

A field missing from the yaml, without a comment there, or whose yaml default disagrees with the dataclass is
an error naming the field and the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from mrtpo_verl.config import MRTPOConfig, MRTPOConfigError, ReplayConfig

__all__ = ["ConfigReferenceError", "FieldReference", "field_references", "render", "yaml_comments", "yaml_defaults"]

YAML_NAME = "mrtpo_trainer.yaml"
REGENERATE = "python -m mrtpo_verl.config_reference > docs/configuration.md"


class ConfigReferenceError(RuntimeError):
    """The dataclasses, the yaml and its comments disagree; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class FieldReference:
    """One ``mrtpo.*`` field as the reference page shows it."""

    path: str
    type: str
    default: str
    allowed: str
    meaning: str


class _Refused:
    """A value no validator accepts; its repr is never shown."""


_ALLOWED = re.compile(r"\(allowed: (?P<allowed>.*)\)\s*$", re.DOTALL)


def _yaml_text() -> str:
    return resources.files("mrtpo_verl.configs").joinpath(YAML_NAME).read_text(encoding="utf-8")


def yaml_comments(text: str | None = None) -> dict[str, str]:
    """The comment lines right above each key of the yaml's ``mrtpo:`` block, joined, by dotted path.

    Args:
        text: the yaml text; default the shipped ``mrtpo_trainer.yaml``.

    Returns:
        ``{"beta": "...", "replay.placement": "...", ...}`` (paths relative to ``mrtpo``).
    """
    lines = (text if text is not None else _yaml_text()).splitlines()
    comments: dict[str, str] = {}
    inside = False
    parents: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not inside:
            inside = line.startswith("mrtpo:")
            continue
        if stripped and indent == 0:
            break  # the next top-level block
        if not stripped:
            pending = []
        elif stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
        elif ":" in stripped:
            key = stripped.split(":", 1)[0].strip()
            while parents and parents[-1][0] >= indent:
                parents.pop()
            path = ".".join([*(name for _, name in parents), key])
            comments[path] = " ".join(pending)
            pending = []
            if stripped.endswith(":"):
                parents.append((indent, key))
    return comments


def yaml_defaults() -> dict[str, Any]:
    """The yaml's ``mrtpo`` block as written (interpolations unresolved), flattened to dotted paths."""
    from omegaconf import OmegaConf

    block = OmegaConf.to_container(OmegaConf.create(_yaml_text()).mrtpo, resolve=False)
    assert isinstance(block, dict)
    flat: dict[str, Any] = {}
    for key, value in block.items():
        if key == "replay":
            flat.update({f"replay.{name}": inner for name, inner in value.items()})
        else:
            flat[str(key)] = value
    return flat


def _fields() -> Iterator[tuple[str, dataclasses.Field[Any]]]:
    for field in dataclasses.fields(MRTPOConfig):
        if field.name != "replay":
            yield field.name, field
    for field in dataclasses.fields(ReplayConfig):
        yield f"replay.{field.name}", field


def _base_config() -> MRTPOConfig:
    return MRTPOConfig(reward_keys=("r",), verifier_info_keys=("r_info",))


def _with(config: MRTPOConfig, path: str, value: Any) -> MRTPOConfig:
    if path.startswith("replay."):
        return dataclasses.replace(config, replay=dataclasses.replace(config.replay, **{path[len("replay.") :]: value}))
    return dataclasses.replace(config, **{path: value})


def _allowed(path: str, type_name: str) -> str:
    """The validator's ``allowed`` text for a field: the first refused probe value's error names it."""
    probes: tuple[Any, ...] = (_Refused(), (), (1.0, 2.0), -1, "\x00refused")
    for probe in probes:
        try:
            _with(_base_config(), path, probe).validate()
        except MRTPOConfigError as error:
            message = str(error)
            match = _ALLOWED.search(message)
            if message.startswith(f"mrtpo.{path}:") and match:
                return match.group("allowed")
        except (TypeError, ValueError, KeyError, IndexError):
            continue  # the probe was not even of a shape the validator reads; try the next
    return "any string" if type_name == "str" else f"any {type_name}"


def _shown(value: Any) -> str:
    """A yaml value written as in the yaml."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_shown(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {_shown(item)}" for key, item in value.items()) + "}"
    if isinstance(value, str) and "\n" in value:
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _default(path: str, field: dataclasses.Field[Any], written: Any) -> str:
    if field.default is not dataclasses.MISSING:
        declared: Any = field.default
    elif field.default_factory is not dataclasses.MISSING:
        declared = field.default_factory()
    else:
        return f"{_shown(written)} (required)"
    if isinstance(written, str) and written.startswith("${"):
        return f"{written} (otherwise {_shown(declared)})"
    comparable = tuple(written) if isinstance(written, list) else written
    if comparable != declared:
        raise ConfigReferenceError(
            f"mrtpo.{path}: mrtpo_trainer.yaml sets {_shown(written)} but the dataclass default is "
            f"{_shown(declared)}; make them equal (mrtpo_verl/config.py or mrtpo_verl/configs/{YAML_NAME})"
        )
    return _shown(written)


def field_references() -> list[FieldReference]:
    """Every ``mrtpo.*`` field, in the dataclasses' order.

    Raises:
        ConfigReferenceError: a field is missing from the yaml or has no comment there, the yaml has a field the
            dataclasses lack, or a yaml default differs from the dataclass default.
    """
    comments, written = yaml_comments(), yaml_defaults()
    declared = {path for path, _ in _fields()}
    extra = sorted(set(written) - declared)
    if extra:
        raise ConfigReferenceError(f"mrtpo.{extra[0]}: in {YAML_NAME} but not a field of the config dataclasses")
    references = []
    for path, field in _fields():
        if path not in written:
            raise ConfigReferenceError(
                f"mrtpo.{path}: a dataclass field missing from {YAML_NAME}; add it with its default"
            )
        comment = comments.get(path, "")
        if not comment:
            raise ConfigReferenceError(
                f"mrtpo.{path}: no comment above it in {YAML_NAME}; write one line saying what it does"
            )
        type_name = str(field.type)
        references.append(
            FieldReference(
                path=f"mrtpo.{path}",
                type=type_name,
                default=_default(path, field, written[path]),
                allowed=_allowed(path, type_name),
                meaning=comment,
            )
        )
    return references


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(references: list[FieldReference] | None = None) -> str:
    """The markdown page (``docs/configuration.md``)."""
    references = field_references() if references is None else references
    out = [
        "# Configuration reference: the `mrtpo` block",
        "",
        f"<!-- Generated by `{REGENERATE}` from mrtpo_verl/config.py and mrtpo_verl/configs/{YAML_NAME}; "
        "do not edit by hand. tests/test_config_reference_on_cpu.py fails when this file is out of date. -->",
        "",
        "`python -m mrtpo_verl.main_ppo` composes verl 0.9.1's `ppo_trainer` with "
        f"`mrtpo_verl/configs/{YAML_NAME}`, which adds the `mrtpo:` block below (and sets "
        "`algorithm.adv_estimator=mrtpo`, `trainer.v1.trainer_mode=mrtpo_sync`, `actor.strategy=fsdp2`). "
        "Start-up validates every field (`MRTPOConfig.from_block`); a bad value stops the run in one line naming "
        "the field and the allowed values. *Default* is the value the yaml ships; *allowed* is the validator's "
        "own rule.",
        "",
        "| field | type | default | allowed | meaning |",
        "|---|---|---|---|---|",
    ]
    for ref in references:
        out.append(
            f"| `{ref.path}` | `{_cell(ref.type)}` | `{_cell(ref.default)}` | {_cell(ref.allowed)} | "
            f"{_cell(ref.meaning)} |"
        )
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mrtpo_verl.config_reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", metavar="FILE", help="exit 1 with a diff when FILE is not what would be written")
    args = parser.parse_args(argv)
    try:
        page = render()
    except ConfigReferenceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check is None:
        sys.stdout.write(page)
        return 0
    current = Path(args.check).read_text(encoding="utf-8") if Path(args.check).exists() else ""
    if current == page:
        return 0
    diff = difflib.unified_diff(current.splitlines(), page.splitlines(), args.check, "generated", lineterm="")
    print("\n".join(diff), file=sys.stderr)
    print(f"error: {args.check} is out of date; regenerate it: {REGENERATE}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Start-up checks of verl's part of a run config: value types, then verl's own ``validate_config``.

verl 0.9.1's ``ppo_trainer`` is plain yaml, so hydra takes ``data.train_batch_size=abc`` as a string
and the mistake surfaces much later as a ``TypeError`` inside a worker. Each scalar is compared here
with the type of its default in the composed base config (the same yaml without the command line):
a boolean stays a boolean, an integer an integer, a float a number. Fields whose default is null,
a string, a list or a mapping accept what verl accepts and are left to verl.
"""

from __future__ import annotations

import contextlib
import sys
import typing
from collections.abc import Iterator
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mrtpo_verl.compat.omegaconf import WrittenValue, written_value
from mrtpo_verl.startup.mistakes import ConfigMistake

__all__ = ["check_estimator", "check_value_types", "check_verl_config"]

#: Our own block: validated field by field by :class:`mrtpo_verl.config.MRTPOConfig`.
OWN_BLOCKS = ("mrtpo",)
_MISSING = object()
#: What to write in place of the value, per allowed type.
PLACEHOLDERS = {"true | false": "true|false", "an integer": "integer", "a number": "number"}


def _leaves(node: DictConfig, path: str = "") -> Iterator[tuple[str, WrittenValue]]:
    """(dotted path, value as written) of every scalar under ``node`` outside lists."""
    for key in node:
        value = written_value(node, key)
        child = f"{path}.{key}" if path else str(key)
        if isinstance(value, DictConfig):
            yield from _leaves(value, child)
        elif isinstance(value, WrittenValue):
            yield child, value


def _raw(config: DictConfig, path: str) -> Any:
    """The :class:`WrittenValue` at ``path``; _MISSING if absent or not a scalar."""
    parent_path, _, key = path.rpartition(".")
    parent = OmegaConf.select(config, parent_path, default=None) if parent_path else config
    if not isinstance(parent, DictConfig) or key not in parent:
        return _MISSING
    value = written_value(parent, key)
    return value if isinstance(value, WrittenValue) else _MISSING


def _declared_float(defaults: DictConfig, path: str) -> bool:
    """Whether verl's dataclass for the field's section (its ``_target_``) declares the field a float.

    verl's yaml writes some float fields with integer defaults (``rollout.top_p: 1``, ``actor.entropy_coeff: 0``);
    the dataclass says what the field is.
    """
    parent_path, _, key = path.rpartition(".")
    parent = OmegaConf.select(defaults, parent_path, default=None) if parent_path else defaults
    target = parent.get("_target_") if isinstance(parent, DictConfig) else None
    if not isinstance(target, str):
        return False
    try:
        from hydra.utils import get_class

        declared = typing.get_type_hints(get_class(target)).get(key)
    except Exception:  # a target that does not import here: fall back to the default's own type
        return False
    return declared is float or float in typing.get_args(declared)


def _expected(default: Any, declared_float: bool = False) -> tuple[tuple[type, ...], str] | None:
    if isinstance(default, bool):
        return (bool,), "true | false"
    if isinstance(default, int) and not declared_float:
        return (int,), "an integer"
    if isinstance(default, int):
        return (int, float), "a number"
    if isinstance(default, float):
        return (int, float), "a number"
    return None


def check_value_types(config: DictConfig, defaults: DictConfig) -> None:
    """Every scalar whose default is a boolean or a number must still be one.

    Args:
        config: the composed run config.
        defaults: the same config composed without the command line's overrides.

    Raises:
        ConfigMistake: ``<field>: got <value> (<type>) (allowed: <type>, as verl's default <default>)``.
    """
    for path, default_node in _leaves(defaults):
        if path.split(".", 1)[0] in OWN_BLOCKS or default_node.is_interpolation:
            continue
        default = default_node.value
        expected = _expected(default, isinstance(default, int) and _declared_float(defaults, path))
        node = _raw(config, path)
        if expected is None or node is _MISSING or node.is_interpolation or node.is_none:
            continue
        value = node.value
        types, allowed = expected
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise ConfigMistake(
                f"{path}: got {value!r} ({type(value).__name__}) (allowed: {allowed}, as verl's default "
                f"{default!r}); set {path}=<{PLACEHOLDERS[allowed]}>"
            )


def check_estimator(config: DictConfig) -> None:
    """``algorithm.adv_estimator`` must be one verl can run: ``gae`` or a name in verl's estimator registry.

    verl looks the name up only when the first advantage is computed, inside a Ray worker.
    """
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, AdvantageEstimator

    import mrtpo_verl.estimator  # noqa: F401  (registers mrtpo, as the plugin does in every verl process)

    name = str(OmegaConf.select(config, "algorithm.adv_estimator"))
    known = sorted({AdvantageEstimator.GAE.value, *ADV_ESTIMATOR_REGISTRY})
    if name not in known:
        from mrtpo_verl.startup.mistakes import closest

        guess = closest(name, known)
        raise ConfigMistake(
            f"algorithm.adv_estimator: {name!r} is not an estimator verl knows"
            + (f" (did you mean {guess!r}?)" if guess else "")
            + f"; allowed: {' | '.join(known)}"
        )


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    # verl's checks print notices on stdout; the dry run keeps stdout for the resolved config.
    with contextlib.redirect_stdout(sys.stderr):
        yield


def check_verl_config(config: DictConfig) -> None:
    """verl's own start-up checks, as verl 0.9.1's ``main`` runs them before Ray (batch sizes, micro-batches, …)."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with _stdout_to_stderr():
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )

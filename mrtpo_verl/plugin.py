"""verl plugin entry point: registers ``mrtpo`` (estimator) and the ``mrtpo_<mode>`` v1 trainers.

``setup.py`` declares this module in verl's ``verl.plugins`` entry-point group, which ``import verl``
loads in every process (driver and Ray workers). Most of those processes (rollout servers, reward and
agent-loop workers) never look up an estimator or a trainer, and importing ours would pull verl's
trainer stack into each of them (the cost: docs/performance.md). So nothing is imported
here: a post-import hook (``wrapt.register_post_import_hook``) registers the estimator when verl's
estimator registry module finishes importing, and the trainers when its trainer registry module does
(module names: :mod:`mrtpo_verl.compat.verl_registries`). Each look-up function lives in the module
that holds its registry, so the registration always precedes the first look-up; a hook on a module
already imported runs at once.

verl 0.9.1 catches a plugin's import error and logs it at *debug* level only, which would turn a
broken install into a confusing "Unknown advantage estimator" much later. So a failure to import our
estimator or trainers is logged at ERROR with its traceback, and a failed estimator is registered as a
placeholder ``mrtpo`` that raises the original error the moment a run asks for it.
"""

from __future__ import annotations

import logging
import traceback
from types import ModuleType
from typing import Any

import wrapt

from mrtpo_verl.compat.verl_registries import ESTIMATOR_REGISTRY_MODULE, TRAINER_REGISTRY_MODULE

logger = logging.getLogger("mrtpo_verl")


class MRTPOPluginLoadError(RuntimeError):
    """mrtpo-verl is installed but could not be imported; the message holds the original traceback."""


def _register_placeholder(cause: BaseException) -> None:
    from verl.trainer.ppo.core_algos import register_adv_est

    details = "".join(traceback.format_exception(cause))

    @register_adv_est("mrtpo")
    def mrtpo_failed_to_load(*args: Any, **kwargs: Any) -> Any:
        raise MRTPOPluginLoadError(f"the mrtpo estimator could not be loaded:\n{details}")


def _log_failure(error: BaseException) -> None:
    logger.error(
        "mrtpo-verl plugin failed to load; 'mrtpo' will raise when used:\n%s",
        "".join(traceback.format_exception(error)),
    )


def register_estimator(_registry_module: ModuleType) -> None:
    """Register ``mrtpo`` (importing :mod:`mrtpo_verl.estimator` registers it); loud placeholder on failure."""
    try:
        from mrtpo_verl import estimator  # noqa: F401
    except Exception as error:  # verl would swallow it at debug level: make it loud instead.
        _log_failure(error)
        _register_placeholder(error)


def register_trainers(_registry_module: ModuleType) -> None:
    """Register ``mrtpo_sync``, ``mrtpo_colocate_async`` and ``mrtpo_separate_async``; logged loudly on failure."""
    try:
        from mrtpo_verl.trainer import mrtpo_trainer  # noqa: F401
    except Exception as error:  # verl's trainer look-up then names the modes it has; this log names the cause.
        _log_failure(error)


wrapt.register_post_import_hook(register_estimator, ESTIMATOR_REGISTRY_MODULE)
wrapt.register_post_import_hook(register_trainers, TRAINER_REGISTRY_MODULE)

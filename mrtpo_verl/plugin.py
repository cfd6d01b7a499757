"""verl plugin entry point: importing this module registers ``mrtpo`` (estimator) and the ``mrtpo_<mode>`` v1 trainers.

``setup.py`` declares it in verl's ``verl.plugins`` entry-point group, which ``import verl``
loads in every process (driver and Ray workers). verl 0.9.1 catches a plugin's import error and
logs it at *debug* level only, which would turn a broken install into a confusing
"Unknown advantage estimator" much later. So a failure here is logged at ERROR with its
traceback, and ``mrtpo`` is registered as a placeholder that raises the original error the
moment a run asks for it.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

logger = logging.getLogger("mrtpo_verl")


class MRTPOPluginLoadError(RuntimeError):
    """mrtpo-verl is installed but could not be imported; the message holds the original traceback."""


def _register_placeholder(cause: BaseException) -> None:
    from verl.trainer.ppo.core_algos import register_adv_est

    details = "".join(traceback.format_exception(cause))

    @register_adv_est("mrtpo")
    def mrtpo_failed_to_load(*args: Any, **kwargs: Any) -> Any:
        raise MRTPOPluginLoadError(f"the mrtpo estimator could not be loaded:\n{details}")


try:
    from mrtpo_verl import estimator as _estimator  # noqa: F401  (import registers "mrtpo")
    from mrtpo_verl.trainer import mrtpo_trainer as _trainer  # noqa: F401  (registers mrtpo_sync, mrtpo_colocate_async, mrtpo_separate_async)
except Exception as error:  # verl would swallow it at debug level: make it loud instead.
    logger.error(
        "mrtpo-verl plugin failed to load; 'mrtpo' will raise when used:\n%s",
        "".join(traceback.format_exception(error)),
    )
    _register_placeholder(error)

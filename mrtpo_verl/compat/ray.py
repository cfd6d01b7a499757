"""Ray detail: the Python class behind a ``ray.remote`` actor class."""

from __future__ import annotations

from typing import Any

__all__ = ["liveness_call", "remote_class"]


def remote_class(actor_class: Any) -> type | None:
    """The class ``ray.remote`` wrapped (None for anything else).

    Relies on: Ray 2.x keeping it as ``ActorClass.__ray_actor_class__``.
    """
    wrapped = getattr(actor_class, "__ray_actor_class__", None)
    return wrapped if isinstance(wrapped, type) else None


def liveness_call(handle: Any) -> Any:
    """An ``ObjectRef`` that resolves when the actor can run a call, and raises Ray's actor error when it has died.

    Relies on: Ray 2.x's built-in ``__ray_ready__`` actor method.
    """
    return handle.__ray_ready__.remote()

"""FSDP details: a module's wrapped module, and keeping an FSDP2 module's parameters gathered."""

from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["first_fsdp2_module", "is_fsdp2", "keep_unsharded", "reshard", "wrapped_module"]


def wrapped_module(module: nn.Module) -> nn.Module:
    """The module an FSDP1 wrapper holds; the module itself otherwise (FSDP2 shards in place).

    Relies on: FSDP1's ``_fsdp_wrapped_module`` attribute (torch ≥ 2.0).
    """
    return getattr(module, "_fsdp_wrapped_module", module)  # type: ignore[no-any-return]


def is_fsdp2(module: Any) -> bool:
    """Whether ``fully_shard`` (FSDP2) was applied to the module.

    Relies on: ``torch.distributed.fsdp.FSDPModule`` (public since torch 2.6).
    """
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def first_fsdp2_module(*modules: Any) -> Any:
    """The first of ``modules`` that is an FSDP2 module (owns its parameters' shards), else None."""
    return next((module for module in modules if is_fsdp2(module)), None)


def keep_unsharded(owner: Any) -> None:
    """All-gather ``owner``'s own parameters (a collective) and keep them gathered across forward passes.

    Relies on: ``FSDPModule.set_reshard_after_forward(False, recurse=False)`` and ``unshard()`` (torch ≥ 2.6).
    """
    owner.set_reshard_after_forward(False, recurse=False)
    owner.unshard()


def reshard(owner: Any, reshard_after_forward: bool) -> None:
    """Free ``owner``'s gathered parameters (local, no communication) and restore its reshard setting.

    Relies on: ``FSDPModule.set_reshard_after_forward`` and ``reshard()`` (torch ≥ 2.6).
    """
    owner.set_reshard_after_forward(reshard_after_forward, recurse=False)
    owner.reshard()

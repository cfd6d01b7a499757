"""FSDP details: a module's wrapped module, keeping an FSDP2 module's parameters gathered, its input casts."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = [
    "first_fsdp2_module",
    "forward_inputs_uncast",
    "is_fsdp2",
    "keep_unsharded",
    "reshard",
    "wrapped_module",
]


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


@contextmanager
def forward_inputs_uncast(root: nn.Module) -> Iterator[None]:
    """Within the block, no FSDP2 module under ``root`` casts its forward inputs to its mixed-precision
    ``param_dtype`` (hidden states entering each sharded layer stay float32); parameters are gathered as before.

    Relies on: ``FSDPModule._get_fsdp_state()`` and the state's ``_mp_policy`` (a frozen ``MixedPrecisionPolicy``
    whose ``cast_forward_inputs`` the pre-forward hook reads at each call), torch 2.6–2.13.
    """
    states = [module._get_fsdp_state() for module in root.modules() if is_fsdp2(module)]
    saved = [(state, state._mp_policy) for state in states]
    try:
        for state, policy in saved:
            state._mp_policy = dataclasses.replace(policy, cast_forward_inputs=False)
        yield
    finally:
        for state, policy in saved:
            state._mp_policy = policy

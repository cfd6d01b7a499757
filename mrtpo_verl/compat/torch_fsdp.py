"""FSDP details: a module's wrapped module, keeping an FSDP2 module's parameters gathered, its input casts, the
dtype its parameters are gathered in."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = [
    "TESTED_TORCH",
    "first_fsdp2_module",
    "forward_inputs_uncast",
    "gathered_as_stored",
    "is_fsdp2",
    "keep_unsharded",
    "reshard",
    "wrapped_module",
]

#: The torch minor versions (first, last, both included) the seams' contract tests ran on; ``setup.py``'s torch
#: range says the same, and :mod:`mrtpo_verl.startup.torch_version` names a torch outside it at start-up.
TESTED_TORCH = ("2.6", "2.13")


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


@contextmanager
def gathered_as_stored(root: nn.Module, gather_dtype: torch.dtype | None = None) -> Iterator[None]:
    """Within the block, every FSDP2 module under ``root`` all-gathers its parameters in the dtype its shards are
    stored in (verl's float32 master weights), not in its mixed-precision ``param_dtype``, and casts no forward
    inputs to ``param_dtype``; restored after. With ``gather_dtype`` (e.g. fp16 for the replay's fp16 matmuls) the
    shards are cast to that dtype before the gather instead (a bf16 gather's bytes).

    Each module is resharded (local, frees gathered parameters) on entry and on exit, so that the buffers a gather
    fills are made anew in the stored dtype at the block's first gather, and the ``param_dtype`` buffers FSDP keeps
    for reuse come back unchanged after it. A gather inside the block moves the stored dtype's bytes (twice bf16's
    for float32 shards). Without ``gather_dtype``, shards stored in ``param_dtype`` (verl's ``model_dtype=bf16``)
    gather as before.

    The input cast is turned off by :func:`forward_inputs_uncast` (float32 weights would refuse bf16 inputs).

    Relies on: ``FSDPModule._get_fsdp_state()`` and its ``_fsdp_param_group`` (None for a module without parameters
    of its own) with ``mp_policy`` (read when the group is lazily initialised, at the root's first forward) and
    ``fsdp_params``; each ``FSDPParam``'s ``param_dtype`` (None: gather as stored; set from a policy by
    ``init_dtype_attrs``, as lazy initialisation does), ``sharded_param`` (the stored shard, its dtype),
    ``all_gather_outputs`` (the gather's buffers, made at the first gather in that gather's dtype and reused after)
    and ``_unsharded_param`` (the gathered parameter viewing those buffers, made at the first gather), torch 2.6–2.13.
    """
    modules = [module for module in root.modules() if is_fsdp2(module)]
    groups = [group for group in (module._get_fsdp_state()._fsdp_param_group for module in modules) if group]
    missing = object()
    saved_groups = [(group, group.mp_policy) for group in groups]
    saved_params = [
        (param, policy, param.all_gather_outputs, param.__dict__.get("_unsharded_param", missing))
        for group, policy in saved_groups
        for param in group.fsdp_params
    ]
    for module in modules:
        module.reshard()
    try:
        for group, policy in saved_groups:
            group.mp_policy = dataclasses.replace(policy, param_dtype=gather_dtype)
        for param, _, _, _ in saved_params:
            # None where the shard already has that dtype, as init_dtype_attrs clamps it.
            param.param_dtype = None if gather_dtype == param.sharded_param.dtype else gather_dtype
            param.all_gather_outputs = []
            param.__dict__.pop("_unsharded_param", None)
        with forward_inputs_uncast(root):
            yield
    finally:
        for module in modules:
            module.reshard()
        for group, policy in saved_groups:
            group.mp_policy = policy
        for param, policy, outputs, unsharded in saved_params:
            # As the group's lazy initialisation sets it, also where that ran inside the block (the first forward).
            param.init_dtype_attrs(policy)
            param.all_gather_outputs = outputs
            if unsharded is missing:
                param.__dict__.pop("_unsharded_param", None)
            else:
                param._unsharded_param = unsharded

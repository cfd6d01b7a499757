"""verl's actor-engine options and the colocated replay: each option verl users set, on its real FSDP2 engine.

Two ranks of verl's actor worker (gloo, CPU) per option; the colocated relevance of a real batch (SmolLM2
answers to Spider questions, every reward pair needed) is compared with the in-process scorer on the same weights
(docs/verification.md names the test of each row of the engine-option matrix). Every case first asserts that its
option took effect in the engine verl built (an option that never reached the engine gives the plain relevance too):

- fused kernels (torch backend), remove-padding, gradient checkpointing, parameter and optimizer offload,
  torch.compile, one engine each with the others off: what the option leaves on the engine or model (verl's fused
  forward, verl's flash-attention patch, checkpointing on the layers, the offload flags, the compiled entropy
  function), the replay's passes inside verl's ``eval_mode`` (offloaded parameters loaded and put back), and the plain
  relevance to 1e-5;
- LoRA (a random non-zero adapter loaded by verl): adapters on every targeted layer; the relevance of the merged
  model, not of the base;
- bf16 weights (``model_dtype``): parameters stored in bf16; computed in float32 (the CPU default), the relevance
  of the bf16 weights, within 0.01 of the fp32 relevance; computed in bf16, the fp32 relevance up to bf16's rounding;
- bf16 mixed precision over float32 masters: float32 parameters, FSDP's policy gathering bf16; the float32
  relevance to 1e-5 (fp16 compute within 0.01).

Its own module (and Ray cluster) so that at most one two-rank group is alive at a time. What needs a GPU is in
``benchmarks.gpu_check`` (stage "engine options").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from mrtpo_cpu.launch import save_derived_model
from mrtpo_verl.batch_keys import RELEVANCE_KEY
from mrtpo_verl.trainer.replay_stage import build_request
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.actor_groups import CFG, RANKS, UNSHARED, cpu_ray_cluster, relevance_of, started_actor_group
from tests.support.real_batch import REWARD_KEYS, real_sql_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def ray_cluster():
    with cpu_ray_cluster(RANKS):
        yield


def in_process_relevance(model: Any, tokenizer: Any, data: Any, compute_dtype: str = "fp32") -> torch.Tensor:
    needed = torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool)
    cfg = dataclasses.replace(UNSHARED, replay=dataclasses.replace(UNSHARED.replay, compute_dtype=compute_dtype))
    backend = InProcessBackend(cfg, model, tokenizer)
    return backend.compute_relevance(build_request(data, UNSHARED, needed)).batch[RELEVANCE_KEY]


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """The two-layer model, and its fp32 in-process relevance on the real batch (what every option must give)."""
    from mrtpo_verl.replay.model_loading import load_causal_lm

    path = save_derived_model(tmp_path_factory.mktemp("options") / "model", num_layers=2)
    model, tokenizer = load_causal_lm(str(path), dtype=torch.float32)
    return path, in_process_relevance(model, tokenizer, real_sql_batch())


MODEL, ACTOR, FSDP = "actor_rollout_ref.model", "actor_rollout_ref.actor", "actor_rollout_ref.actor.fsdp_config"
VERL_FUSED_FORWARD = "verl.models.transformers.dense_common.forward_with_torch_backend"
VERL_FLASH_FORWARD = "verl.models.transformers.monkey_patch._ulysses_flash_attention_forward"
#: What :meth:`FaultyActorWorker.engine_facts` reads with none of these options on (verl's gradient checkpointing,
#: on by default, turned off): every case checks its own facts on and every other fact off, so a fact that reads the
#: same whatever the option cannot pass.
FACTS_OFF = {
    "forward": "transformers.models.llama.modeling_llama.forward",
    "remove_padding": "False",
    "flash_attention_forward": "transformers.modeling_flash_attention_utils._flash_attention_forward",
    "gradient_checkpointing": "False",
    "param_offload": "False",
    "optimizer_offload": "False",
    "entropy_compiled": "False",
    "peft": "False",
    "lora_layers": "0",
    "param_dtypes": "torch.float32",
    "fsdp_param_dtype": "torch.float32",
}
#: Options that must not change the replay's arithmetic, one engine each: (overrides, the facts they turn on).
SAME_ARITHMETIC = {
    "fused_kernels_torch": (
        (
            f"{MODEL}.use_fused_kernels=true",
            f"{ACTOR}.use_fused_kernels=true",
            f"{MODEL}.fused_kernel_options.impl_backend=torch",  # the Triton backend needs a GPU (benchmarks.gpu_check)
        ),
        {"forward": VERL_FUSED_FORWARD},  # verl's fused log-prob forward is the model class's forward
    ),
    "remove_padding": (
        (f"{MODEL}.use_remove_padding=true", f"{ACTOR}.use_remove_padding=true"),
        {"remove_padding": "True", "flash_attention_forward": VERL_FLASH_FORWARD},  # verl's flash-attention patch
    ),
    "gradient_checkpointing": (
        (f"{MODEL}.enable_gradient_checkpointing=true",),
        {"gradient_checkpointing": "True"},  # on the HF model's layers
    ),
    "param_and_optimizer_offload": (
        (f"{FSDP}.param_offload=true", f"{FSDP}.optimizer_offload=true"),
        {"param_offload": "True", "optimizer_offload": "True"},
    ),
    "torch_compile": (
        (f"{ACTOR}.use_torch_compile=true", f"{FSDP}.use_torch_compile=true"),
        {"entropy_compiled": "True"},  # verl compiles its entropy function, the only thing it compiles
    ),
}


@pytest.mark.parametrize("option", list(SAME_ARITHMETIC))
def test_each_engine_option_that_keeps_the_arithmetic_takes_effect_and_gives_the_plain_relevance(
    ray_cluster, tied_model, option: str
) -> None:
    """One option on verl's engine (the others off): it took effect in the built engine, the replay's passes ran
    inside verl's ``eval_mode`` (offloaded parameters loaded on entry and offloaded after; the decoder in eval mode,
    so gradient checkpointing, which drops the KV cache in training mode, is inactive), and the relevance is the
    plain in-process float32 relevance to 1e-5."""
    path, expected = tied_model
    overrides, facts_on = SAME_ARITHMETIC[option]
    if f"{MODEL}.enable_gradient_checkpointing=true" not in overrides:
        overrides = (*overrides, f"{MODEL}.enable_gradient_checkpointing=false")
    wanted = FACTS_OFF | facts_on
    with started_actor_group(path, overrides, name="options_test") as group:
        facts = group.engine_facts()[0]
        assert {key: facts[key] for key in wanted} == wanted, facts
        relevance = relevance_of(group, real_sql_batch())
        records = group.replay_record()
    checkpointing, offloaded = wanted["gradient_checkpointing"] == "True", wanted["param_offload"] == "True"
    for record in records:
        # Every decoder call: verl's engine in eval mode, the decoder not training (checkpointing, if on, inactive).
        assert record["passes"] and set(record["passes"]) == {("eval", False, checkpointing)}, set(record["passes"])
        # verl's eval_mode: engine.to(model=param_offload) on entry (the load; "cpu" is the device here) and on exit.
        assert record["moves"] == [("cpu", offloaded), ("cpu", offloaded)], record["moves"]
    torch.testing.assert_close(relevance, expected, atol=1e-5, rtol=0)


def random_lora_adapter(model_dir: Path) -> Path:
    """A LoRA adapter (rank 8, every linear layer) with non-zero random weights, saved for verl to load."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    config = LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False, task_type="CAUSAL_LM")
    out = model_dir.parent / "lora_adapter"
    get_peft_model(model, config).save_pretrained(out)
    return out


def test_lora_replays_with_the_adapted_weights(ray_cluster, tied_model) -> None:
    from peft import PeftModel

    from mrtpo_verl.replay.model_loading import load_causal_lm

    path, base_relevance = tied_model
    adapter = random_lora_adapter(path)
    model, tokenizer = load_causal_lm(str(path), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    expected = in_process_relevance(merged, tokenizer, real_sql_batch())
    assert (expected - base_relevance).abs().max() > 1e-2, "the adapter changes the relevance (else no check)"
    options = (f"{MODEL}.lora_rank=8", f"{MODEL}.lora_alpha=16", f"+{MODEL}.lora_adapter_path={adapter}")
    with started_actor_group(path, options, name="lora_test") as group:
        facts = group.engine_facts()[0]
        # verl wrapped the model in peft with the adapter's weights: every targeted linear layer of both decoder
        # layers carries a LoRA B (verl's own initialisation would leave it zero; the adapter's is random).
        assert (facts["peft"], facts["lora_layers"], facts["lora_b_nonzero"]) == ("True", "14", "True"), facts
        relevance = relevance_of(group, real_sql_batch())
    torch.testing.assert_close(relevance, expected, atol=1e-5, rtol=0)


def test_bf16_mixed_precision_replays_in_float32(ray_cluster, tied_model) -> None:
    """bf16 weights and verl's bf16 autocast.

    With ``compute_dtype=fp32`` (the default) the replay computes in float32 (bf16 weights upcast, no autocast,
    no cast of the layers' inputs): within the replay's agreement goal of the float32 relevance (max |Δq| ≤ 0.01)
    and far closer than bf16 compute. With ``compute_dtype=model`` it computes in bf16 like verl's forward and
    moves q by bf16's own rounding (a JS *distance* grows like the logits' error), within twice what bf16 does
    to the in-process scorer."""
    from mrtpo_verl.replay.model_loading import load_causal_lm

    path, fp32 = tied_model
    in_bf16 = dataclasses.replace(CFG, replay=dataclasses.replace(CFG.replay, compute_dtype="model"))
    options = (f"{FSDP}.model_dtype=bf16", f"+{FSDP}.mixed_precision.param_dtype=bf16")
    with started_actor_group(path, options, name="bf16_test") as group:
        facts = group.engine_facts()[0]
        # The parameters are stored in bf16, gathered and computed in bf16.
        wanted = {"param_dtypes": "torch.bfloat16", "fsdp_param_dtype": "torch.bfloat16", "autocast": "torch.bfloat16"}
        assert {key: facts[key] for key in wanted} == wanted, facts
        float32_compute = relevance_of(group, real_sql_batch())
        bf16_compute = relevance_of(group, real_sql_batch(), in_bf16)
    model, tokenizer = load_causal_lm(str(path), dtype=torch.bfloat16)
    in_process_fp32_compute = in_process_relevance(model, tokenizer, real_sql_batch())
    # verl's engine builds a model_dtype=bf16 module with module.to(bf16), which also rounds the float32 buffers,
    # RoPE's inv_freq among them (from_pretrained(dtype=bf16) keeps them float32): the same model in process.
    as_engine_casts = load_causal_lm(str(path), dtype=torch.float32)[0].to(torch.bfloat16)
    torch.testing.assert_close(
        float32_compute, in_process_relevance(as_engine_casts, tokenizer, real_sql_batch()), atol=1e-5, rtol=0
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        in_process_bf16 = in_process_relevance(model, tokenizer, real_sql_batch(), compute_dtype="model")
    drift = {
        "colocated, fp32 compute": float((float32_compute - fp32).abs().max()),
        "in-process, fp32 compute": float((in_process_fp32_compute - fp32).abs().max()),
        "colocated, bf16 compute": float((bf16_compute - fp32).abs().max()),
        "in-process, bf16 compute": float((in_process_bf16 - fp32).abs().max()),
    }
    print(f"q - fp32 q, max |diff| (mean q {fp32.mean():.4f}): {drift}")
    # Measured: colocated 0.0025, in-process 0.0012, against 0.030 / 0.035 computed in bf16 (the two float32
    # computes differ by the rounded inv_freq, checked above).
    assert drift["colocated, fp32 compute"] <= 0.01
    assert drift["colocated, fp32 compute"] <= drift["colocated, bf16 compute"] / 4
    assert 0 < drift["colocated, bf16 compute"] <= 2 * drift["in-process, bf16 compute"]


def test_bf16_mixed_precision_over_float32_masters_replays_the_float32_model(ray_cluster, tied_model) -> None:
    """verl's default for a trained actor: float32 master shards (``model_dtype`` fp32), gathered in bf16 for every
    forward (``mixed_precision.param_dtype=bf16``), under bf16 autocast.

    With ``compute_dtype=fp32`` (the default) the replay gathers the masters as float32 and computes in float32: the
    float32 model's relevance (1e-5), where bf16-gathered weights would leave their rounding (about 0.005-0.01 on
    the families' batches, ``benchmarks.replay_numerics``). With ``compute_dtype=model`` it gathers and computes as
    verl's forward does; with ``compute_dtype=fp16`` it gathers the masters cast to fp16. A ``model`` request before
    and after the float32 and fp16 ones gives the same tensor bit for bit: FSDP's bf16 gather is restored."""
    path, fp32 = tied_model
    in_bf16 = dataclasses.replace(CFG, replay=dataclasses.replace(CFG.replay, compute_dtype="model"))
    in_fp16 = dataclasses.replace(CFG, replay=dataclasses.replace(CFG.replay, compute_dtype="fp16"))
    options = (f"+{FSDP}.mixed_precision.param_dtype=bf16",)
    with started_actor_group(path, options, name="masters_test") as group:
        facts = group.engine_facts()[0]
        # float32 master shards, FSDP's mixed-precision policy gathers them in bf16, verl's autocast is bf16.
        wanted = {"param_dtypes": "torch.float32", "fsdp_param_dtype": "torch.bfloat16", "autocast": "torch.bfloat16"}
        assert {key: facts[key] for key in wanted} == wanted, facts
        bf16_before = relevance_of(group, real_sql_batch(), in_bf16)
        float32 = relevance_of(group, real_sql_batch())
        fp16 = relevance_of(group, real_sql_batch(), in_fp16)
        bf16_after = relevance_of(group, real_sql_batch(), in_bf16)
    drift = {
        "float32 masters": float((float32 - fp32).abs().max()),
        "fp16 gather, fp16 matmuls": float((fp16 - fp32).abs().max()),
        "bf16": float((bf16_before - fp32).abs().max()),
    }
    print(f"max |q - fp32 q|: {drift}")
    torch.testing.assert_close(float32, fp32, atol=1e-5, rtol=0)
    assert drift["bf16"] > 1e-3  # bf16 gather and compute move q (else this test could not fail)
    # compute_dtype=fp16 (auto's choice on CUDA; emulated here): the masters gathered as fp16, matmuls on fp16
    # inputs. Within the replay's goal of float32, well inside bf16's drift, and not float32 itself.
    assert 1e-6 < drift["fp16 gather, fp16 matmuls"] <= min(0.01, drift["bf16"] / 4)
    assert torch.equal(bf16_after, bf16_before)  # neither the float32 nor the fp16 gather stays behind

"""The replay's time per ``compute_dtype`` on a GPU: the price of relevance that survives bf16.

The replay's goal: relevance within 0.01 of float32's (max |Δq|) at ≤ 1.1× the replay time of the bf16 path
(``compute_dtype=model`` on bf16 weights). On CPU the agreement is measured (``benchmarks.replay_numerics``), the
time is not: a CPU has fast bf16 matmuls and no fast fp16 ones, so ``fp16`` is emulated there. This stage times the
in-process scorer on one GPU, each compute dtype on the weights the colocated replay would use for it:

- ``model``: bf16 weights, bf16 compute (verl's forward, the baseline);
- ``fp32`` / ``tf32``: float32 weights (the masters gathered as float32), float32 / TF32 matmuls;
- ``fp16``: fp16 weights (the masters gathered cast to fp16), fp16 tensor-core matmuls with float32 accumulation.

The model is a Llama-architecture decoder of about 1.2B parameters with random weights (no download: timing
needs the shapes only); the batch a GRPO-like group set: 8 responses of 512 tokens after a 1,024-token prompt and
three verifier texts of 192 tokens, every (response, reward) pair needed; the scorer has ``mrtpo.replay``'s default
budgets. Each dtype runs once to warm up, then is timed (median of 3; 1 with ``--quick``). |Δq| against fp32 is shown
too, on these random weights (a sanity figure, not the agreement measurement).

The verdict is on ``auto`` (the default): what it resolves to on the device must take ≤ :data:`TIME_GOAL` × the bf16
path. Beside it, the replay under ``auto`` against a plain forward + log-prob pass of the same responses after their
prompts on the same bf16 model (:func:`plain_log_prob_seconds`: what verl's old-log-prob pass costs, without verl):
the ratio a cluster user sees between the replay stage and that pass. Run by ``python -m benchmarks.gpu_check``
("replay time per compute_dtype"); ``--dry-run-cpu`` runs it on a tiny model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from dataclasses import dataclass

import torch

#: The goal: the default (``auto``) replay's seconds ≤ this × the bf16 path's.
TIME_GOAL = 1.1


@dataclass(frozen=True)
class Workload:
    """Model and batch shapes of one run."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    responses: int
    prompt_tokens: int
    info_tokens: int
    response_tokens: int
    repeats: int


GPU_WORKLOAD = Workload(2048, 8192, 16, 16, 8, 49152, 8, 1024, 192, 512, 3)
DRY_RUN_WORKLOAD = Workload(64, 128, 2, 4, 2, 512, 2, 24, 6, 8, 1)
REWARDS = 3


def _model(workload: Workload, device: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=workload.vocab,
        hidden_size=workload.hidden,
        intermediate_size=workload.intermediate,
        num_hidden_layers=workload.layers,
        num_attention_heads=workload.heads,
        num_key_value_heads=workload.kv_heads,
        max_position_embeddings=8192,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        return LlamaForCausalLM(config).eval()


def _items(workload: Workload) -> list:
    """Synthetic replay contexts: a shared prompt, three verifier texts (the full context carries all, each
    leave-one-out context drops one), a response per item."""
    from mrtpo_verl.replay.contexts import ReplayContexts

    generator = torch.Generator().manual_seed(1)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(10, workload.vocab, (count,), generator=generator).tolist())

    prompt, infos = tokens(workload.prompt_tokens), [tokens(workload.info_tokens) for _ in range(REWARDS)]
    full = prompt + sum(infos, ())
    leave_one_out = tuple(prompt + sum((info for j, info in enumerate(infos) if j != k), ()) for k in range(REWARDS))
    return [
        ReplayContexts(full, leave_one_out, tokens(workload.response_tokens), (False,) * REWARDS, (False,) * REWARDS)
        for _ in range(workload.responses)
    ]


def plain_log_prob_seconds(model: torch.nn.Module, workload: Workload, device: str) -> float:
    """Median seconds of what verl's old-log-prob pass costs, without verl: one forward of every response after its
    prompt (no verifier text), ``(responses, prompt + response)`` tokens in one micro-batch, logits over every
    position (as transformers gives them), then float32 log-softmax and the response tokens' log-probabilities."""
    generator = torch.Generator().manual_seed(2)
    length = workload.prompt_tokens + workload.response_tokens
    input_ids = torch.randint(10, workload.vocab, (workload.responses, length), generator=generator).to(device)
    responses = input_ids[:, workload.prompt_tokens :]

    def one_pass() -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits[:, workload.prompt_tokens - 1 : -1]
            return torch.log_softmax(logits.float(), dim=-1).gather(-1, responses[..., None])

    one_pass()  # warm-up
    timings = []
    for _ in range(workload.repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        one_pass()
        if device == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def replay_dtype_results(device: str, dry_run: bool, quick: bool = False) -> list[tuple[str, str, str, bool]]:
    """Per compute dtype: (setting, seconds and ratio to ``model``, reference, ok); then ``auto`` (what it resolves
    to on ``device``) against :data:`TIME_GOAL`, and the replay against a plain forward + log-prob pass of the same
    responses on the same bf16 model. Timing rows are always ok in a dry run (CPU timings mean nothing)."""
    from benchmarks.gpu_twins import JS_PATH
    from mrtpo_verl.config import ReplayConfig
    from mrtpo_verl.replay.model_loading import cast_parameters
    from mrtpo_verl.replay.scorer import ReplayScorer, compute_dtype_for

    workload = DRY_RUN_WORKLOAD if dry_run else GPU_WORKLOAD
    if quick and not dry_run:
        workload = dataclasses.replace(workload, repeats=1)
    items = _items(workload)
    needed = torch.ones(len(items), REWARDS, dtype=torch.bool)
    base = _model(workload, device)
    parameters = sum(p.numel() for p in base.parameters())
    weights = {"model": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16}
    seconds: dict[str, float] = {}
    relevance: dict[str, torch.Tensor] = {}
    errors: dict[str, str] = {}
    for compute_dtype, dtype in weights.items():
        # In place, bf16 first: every row then holds the same (bf16-representable) weight values.
        model = cast_parameters(base, dtype)
        try:
            scorer = ReplayScorer.from_config(model, ReplayConfig(compute_dtype=compute_dtype))  # a cluster's budgets
            score = functools.partial(scorer.score, items, needed)
            relevance[compute_dtype] = JS_PATH.run(score).relevance.float().cpu()  # warm-up
        except Exception as error:  # e.g. fp16 refused where torch lacks the float32-output fp16 matmul
            errors[compute_dtype] = f"{type(error).__name__}: {str(error).splitlines()[0][:140]}"
            continue
        timings = []
        for _ in range(workload.repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            JS_PATH.run(score)
            timings.append(time.perf_counter() - start)
        seconds[compute_dtype] = statistics.median(timings)
    shape = f"{parameters / 1e9:.2f}B params"
    if "model" not in seconds:
        return [("compute_dtype=model", errors.get("model", "not run"), "-", False)]
    baseline = seconds["model"]
    results = []
    for compute_dtype in weights:
        if compute_dtype in errors:
            results.append((f"compute_dtype={compute_dtype}", errors[compute_dtype], "-", False))
            continue
        ratio = seconds[compute_dtype] / baseline
        error = float((relevance[compute_dtype] - relevance["fp32"]).abs().max()) if "fp32" in relevance else math.nan
        value = f"{seconds[compute_dtype]:.3f} s = {ratio:.2f}x bf16 path; max abs dq vs fp32 {error:.1e}"
        results.append((f"compute_dtype={compute_dtype}, {shape}", value, f"model (bf16): {baseline:.3f} s", True))
    resolved = compute_dtype_for("auto", torch.device(device))
    if resolved in seconds:
        ratio = seconds[resolved] / baseline
        results.append(
            (
                f"compute_dtype=auto -> {resolved} (the default)",
                f"{ratio:.2f}x the bf16 path",
                f"goal <= {TIME_GOAL}x",
                dry_run or ratio <= TIME_GOAL,
            )
        )
        cast_parameters(base, torch.bfloat16)
        plain = plain_log_prob_seconds(base, workload, device)
        results.append(
            (
                "replay (auto) vs a plain forward + log-prob pass",
                f"{seconds[resolved]:.3f} s vs {plain:.3f} s = {seconds[resolved] / plain:.2f}x",
                f"{workload.responses} x ({workload.prompt_tokens} + {workload.response_tokens}) tokens, bf16, "
                "logits at every position (verl's old-log-prob pass without verl)",
                True,
            )
        )
    else:
        results.append((f"compute_dtype=auto -> {resolved}", errors.get(resolved, "not run"), "-", False))
    if JS_PATH.failure is not None:  # the times above are then the torch JS path's
        results.append(("the replay's Triton JS kernel", f"failed: {JS_PATH.failure}", "torch JS path timed", False))
    return results

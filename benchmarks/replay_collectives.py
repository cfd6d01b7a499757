"""Collectives of one colocated replay step on verl's FSDP2 actor, against verl's own old-log-prob pass.

verl's real actor worker (the package's ``MRTPOActorRolloutRefWorker``, FSDP2 on gloo, CPU processes, as in
tests/trainer/test_colocated_replay_on_cpu.py) runs on 2 and on 4 ranks. Per task family the batch is real: P
prompts of the shipped demo data (Spider with its schema, BFCL v4 with its function documentation, IFEval), n
responses each sampled (temperature 0.8) by the model the ranks run, SmolLM2-135M-Instruct cut to 2 layers (the
full model's sampling takes too long on a loaded 2-core machine; the counts depend on the lengths and the contexts'
structure, not on the text), and scored by the family's reward function, whose verifier texts make the contexts;
every (response, reward) pair is replayed (exact skipping off: the worst case). On the same batch each group runs

- one replay step: ``ColocatedBackend.compute_relevance`` (the driver's balanced split, then
  ``compute_mrtpo_relevance`` on every rank), with the ``mrtpo.replay`` settings named in the output;
- verl's old-log-prob pass: ``compute_log_prob`` on the batch as verl's trainer sends it
  (``_compute_old_log_prob``: tensordict, no padding, entropy on), with the recipes' default
  ``log_prob_micro_batch_size_per_gpu`` (16 rows, or a rank's whole share when it has fewer).

Counted per rank, in the worker process, between a reset and a read right around each call:

- **param all-gathers**: calls of FSDP2's all-gather communication object (``DefaultAllGather.__call__`` in
  ``torch.distributed.fsdp._fully_shard._fsdp_collectives``, wrapped on the class): one call is one all-gather of
  one FSDP module's parameter group (the root's own parameters, or one decoder layer's); with the engine's
  ``reshard_after_forward=True`` every forward call of the root gathers every module once. The figures are for a
  2-layer SmolLM2 (3 FSDP modules: root and 2 layers); a model of N layers gathers N + 1 per forward call on both
  sides, so the ratio does not depend on the depth.
- **root forwards**: forward calls of the wrapped root module (a forward pre-hook on ``engine.module``); for the
  replay this includes the idle passes a rank with less work runs (also counted on their own).
- **small all-gathers**: ``torch.distributed.all_gather`` calls (the replay ranks' meetings: one before the
  passes, one before every further pass, one at the end).

The row to read is "param all-gathers per replay step / verl old-log-prob" for the busiest rank (every rank waits
for it). Goal: ≤ 2.

    python -m benchmarks.replay_collectives            # 3 families × 4 prompts × 4 responses, 2 and 4 ranks
    python -m benchmarks.replay_collectives --quick    # text_to_sql, 2 prompts × 2 responses, 2 ranks: smoke run
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from ray import cloudpickle
from verl.single_controller.base.decorator import Dispatch, register

from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker

TASKS = ("text_to_sql", "tool_calling", "instruction_following")
GOAL = 2.0
#: verl's old-log-prob micro-batch per GPU in the recipes (recipes/common.sh LOG_PROB_MICRO_BATCH_PER_GPU).
VERL_LOG_PROB_MICRO_BATCH = 16
#: torch.distributed functions counted besides FSDP's parameter all-gathers (context for the small meetings).
COUNTED_FUNCTIONS = ("all_gather", "all_reduce", "broadcast", "all_gather_object", "barrier")


class CountingActorWorker(MRTPOActorRolloutRefWorker):
    """The package's actor worker with collective counters (benchmark only: nothing like it is in the package)."""

    _counts: Counter[str] | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reset_collective_counts(self) -> None:
        if self._counts is None:
            self._install_counters()
        assert self._counts is not None
        self._counts.clear()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def collective_counts(self) -> dict[str, int]:
        return dict(self._counts or {})

    def _install_counters(self) -> None:
        import torch.distributed as dist
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives

        counts: Counter[str] = Counter()
        self._counts = counts
        gather_call = _fsdp_collectives.DefaultAllGather.__call__

        def counted_gather(comm: Any, output_tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counts["param_all_gathers"] += 1
            counts["param_bytes_gathered"] += output_tensor.numel() * output_tensor.element_size()
            return gather_call(comm, output_tensor, *args, **kwargs)

        _fsdp_collectives.DefaultAllGather.__call__ = counted_gather  # type: ignore[method-assign]
        for name in COUNTED_FUNCTIONS:
            original = getattr(dist, name)

            def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
                counts[_name] += 1
                return _original(*args, **kwargs)

            setattr(dist, name, counted)
        from mrtpo_verl.compat.verl import actor_engine, engine_module

        engine_module(actor_engine(self)).register_forward_pre_hook(lambda *_: counts.update(["root_forwards"]))

    def _colocated_replay(self, mrtpo_block: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
        builder, scorer, info_keys = super()._colocated_replay(mrtpo_block)
        runner = scorer.runner
        if "idle_forward" not in vars(runner):
            clean = type(runner).idle_forward.__get__(runner)

            def idle_forward() -> None:
                if self._counts is not None:
                    self._counts["idle_forwards"] += 1
                clean()

            runner.idle_forward = idle_forward
        return builder, scorer, info_keys


# Ray ships the class by value: its workers do not import the benchmarks package.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def family_data(model: Any, tokenizer: Any, task: str, prompts: int, samples: int, max_new_tokens: int) -> Any:
    """``prompts`` demo prompts × ``samples`` responses in verl's layout (uid per prompt), seed 0.

    A prompt whose ground truth the family's verifier cannot use (``GroundTruthError``) is passed over.
    """
    from mrtpo_verl.demo.batch import pack_batch, sample_group
    from mrtpo_verl.demo.tasks import load_prompts
    from reward_fns import dispatch
    from reward_fns.total import GroundTruthError

    torch.manual_seed(0)
    loaded, responses = [], []
    for prompt in load_prompts(task, 4 * prompts):
        try:
            group = sample_group(model, tokenizer, prompt, len(loaded), samples, max_new_tokens, 0.8, False, [task])
        except GroundTruthError:
            continue
        loaded.append(prompt)
        responses += group
        if len(loaded) == prompts:
            break
    return pack_batch(responses, loaded, dispatch.reward_keys([task]), tokenizer.pad_token_id)


def verl_batch(data: Any, ranks: int) -> Any:
    """The tensordict verl's trainer sends to ``compute_log_prob`` for the old log-probs of ``data``.

    The micro-batch is the recipes' 16 rows per rank, or a rank's whole share when it has fewer rows (verl needs
    the share to be a multiple of it).
    """
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    batch = data.select(batch_keys=["prompts", "responses", "response_mask", "attention_mask"])
    batch.batch["input_ids"] = torch.cat([batch.batch["prompts"], batch.batch["responses"]], dim=1)
    batch.batch["position_ids"] = (batch.batch["attention_mask"].cumsum(dim=-1) - 1).clamp(min=0)
    batch.meta_info["temperature"] = 1.0
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(dim=-1).tolist()
    tensordict = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(
        tensordict,
        calculate_entropy=True,
        calculate_sum_pi_squared=False,
        compute_loss=False,
        micro_batch_size_per_gpu=min(VERL_LOG_PROB_MICRO_BATCH, len(data) // ranks),
    )
    return tensordict


def counted(group: Any, call: Any) -> list[dict[str, int]]:
    """Each rank's counts during ``call()``."""
    group.reset_collective_counts()
    call()
    return group.collective_counts()  # type: ignore[no-any-return]


def measure(group: Any, data: Any, cfg: Any, ranks: int) -> tuple[list[dict[str, int]], list[dict[str, int]], Any]:
    """(replay counts per rank, verl counts per rank, the replay's answer) on one batch."""
    from mrtpo_verl.trainer.replay_stage import build_request
    from mrtpo_verl.workers.placement import ColocatedBackend

    needed = torch.ones(len(data), len(cfg.reward_keys), dtype=torch.bool)
    backend = ColocatedBackend(group, cfg)
    answers = []
    backend.compute_relevance(build_request(data, cfg, needed))  # first call builds the scorer: not counted
    replay = counted(group, lambda: answers.append(backend.compute_relevance(build_request(data, cfg, needed))))
    group.compute_log_prob(verl_batch(data, ranks))  # warm-up, as above
    verl = counted(group, lambda: group.compute_log_prob(verl_batch(data, ranks)))
    return replay, verl, answers[0]


def start_group(model_dir: Path, ranks: int, name: str) -> Any:
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    from mrtpo_cpu.launch import compose_actor_config

    options = (f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={VERL_LOG_PROB_MICRO_BATCH}",)
    pool = RayResourcePool(process_on_nodes=[ranks], use_gpu=True, max_colocate_count=1, name_prefix=name)
    worker = RayClassWithInitArgs(
        cls=ray.remote(CountingActorWorker), config=compose_actor_config(model_dir, ranks, options), role="actor"
    )
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=worker, device_name="cpu")
    group.init_model()
    return group


def replay_settings(cfg: Any) -> str:
    replay = cfg.replay
    return (
        f"micro_batch_size={replay.micro_batch_size}, max_tokens_per_micro_batch={replay.max_tokens_per_micro_batch}, "
        f"min_shared_tokens={replay.min_shared_tokens}, share_prefix={replay.share_prefix}"
    )


def row(ranks: int, task: str, data: Any, replay: list[dict[str, int]], verl: list[dict[str, int]]) -> str:
    def per_rank(counts: list[dict[str, int]], key: str) -> str:
        return "/".join(str(rank.get(key, 0)) for rank in counts)

    def busiest(counts: list[dict[str, int]], key: str) -> int:
        return max(rank.get(key, 0) for rank in counts)

    ratio = busiest(replay, "param_all_gathers") / max(1, busiest(verl, "param_all_gathers"))
    groups = len(set(data.non_tensor_batch["uid"]))
    tokens = int(data.batch["attention_mask"].sum())
    cells = [
        str(ranks),
        task,
        f"{groups}×{len(data) // groups} rows, {tokens:,} tokens",
        per_rank(replay, "param_all_gathers"),
        per_rank(replay, "root_forwards"),
        per_rank(replay, "idle_forwards"),
        per_rank(replay, "all_gather"),
        per_rank(verl, "param_all_gathers"),
        per_rank(verl, "root_forwards"),
        f"**{ratio:.2f}×**",
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| ranks | family | batch | replay: param all-gathers per rank | replay: root forwards | of which idle | "
    "replay: small all-gathers | verl old-log-prob: param all-gathers | verl: root forwards | "
    "all-gathers per replay step / verl old-log-prob (busiest rank) |"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="text_to_sql, 2 prompts × 2 responses, 2 ranks")
    parser.add_argument("--ranks", default=None, help="comma-separated rank counts (default 2,4; --quick: 2)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per family (default 4; --quick: 2)")
    parser.add_argument("--samples", type=int, default=None, help="responses per prompt (default 4; --quick: 2)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 48; --quick: 8")
    parser.add_argument("--out", type=Path, default=None, help="also write the output to this markdown file")
    parser.add_argument(
        "--batches", type=Path, default=None, help="pickle of the sampled batches: read if it exists, else written"
    )
    args = parser.parse_args(argv)
    quick = args.quick
    ranks_list = [int(r) for r in (args.ranks or ("2" if quick else "2,4")).split(",")]
    prompts = args.prompts or (2 if quick else 4)
    samples = args.samples or (2 if quick else 4)
    max_new_tokens = args.max_new_tokens or (8 if quick else 48)
    tasks = TASKS[:1] if quick else TASKS
    if min(ranks_list) < 1 or min(prompts, samples, max_new_tokens) < 1:
        raise SystemExit("--ranks, --prompts, --samples and --max-new-tokens must be ≥ 1")
    command = "python -m benchmarks.replay_collectives" + (" " + " ".join(argv) if argv else "")
    lines = [f"command: {command}"]
    print(lines[0], flush=True)

    from mrtpo_cpu.launch import save_derived_model
    from mrtpo_verl.config import MRTPOConfig, ReplayConfig
    from mrtpo_verl.replay.model_loading import load_causal_lm
    from reward_fns import dispatch
    from tests.support.actor_groups import cpu_ray_cluster
    from tests.support.ray_groups import release

    scratch = tempfile.TemporaryDirectory()
    model_dir = save_derived_model(Path(scratch.name) / "model", num_layers=2)
    if args.batches is not None and args.batches.exists():
        batches = pickle.loads(args.batches.read_bytes())
    else:
        model, tokenizer = load_causal_lm(str(model_dir), dtype=torch.float32)
        model.eval()
        batches = {task: family_data(model, tokenizer, task, prompts, samples, max_new_tokens) for task in tasks}
        del model
        if args.batches is not None:
            args.batches.write_bytes(pickle.dumps(batches))
    configs = {
        task: MRTPOConfig(
            reward_keys=tuple(dispatch.reward_keys([task])),
            verifier_info_keys=tuple(dispatch.info_key(k) for k in dispatch.reward_keys([task])),
            replay=ReplayConfig(skip_zero_advantage=False),
        )
        for task in tasks
    }
    settings = replay_settings(next(iter(configs.values())))
    lines += [
        "",
        f"Replay settings (package defaults): {settings}. verl: log_prob_micro_batch_size_per_gpu="
        f"min({VERL_LOG_PROB_MICRO_BATCH}, rows per rank), use_dynamic_bsz=false. Model: SmolLM2-135M-Instruct cut "
        "to 2 layers (3 FSDP modules), fp32, FSDP2 on gloo. Every pair replayed. Per-rank figures are rank0/rank1/...",
        "",
        HEADER,
        "|" + "---|" * HEADER.count(" | ") + "---|",
    ]
    for line in lines[1:]:
        print(line, flush=True)
    with scratch, cpu_ray_cluster(max(ranks_list)):
        for ranks in ranks_list:
            group = start_group(model_dir, ranks, f"collectives_{ranks}")
            try:
                for task in tasks:
                    data = batches[task]
                    if len(data) % ranks:
                        raise SystemExit(f"{len(data)} rows cannot be split over {ranks} ranks for verl's pass")
                    replay, verl, _ = measure(group, data, configs[task], ranks)
                    lines.append(row(ranks, task, data, replay, verl))
                    print(lines[-1], flush=True)
            finally:
                release(group)
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

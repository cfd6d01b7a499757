"""Peak driver memory (RSS) of the relevance tensor's path, against one copy of the tensor.

The path is the driver's, from the moment the replay ranks' answers arrive to the advantages:

1. **merge**: each rank's answer (a ``DataProto`` with ``mrtpo_relevance`` (rows, K, L) float32 and the counters,
   as ``ray.get`` hands it to the driver; synthetic: random relevance, 0 at padding), put together by the collect
   function registered on :meth:`ReplayWorker.compute_relevance <mrtpo_verl.workers.replay_worker.ReplayWorker>`
   (read from that registration, handed the list of answers as verl's worker-group call hands it), then put back
   in the request's order by :func:`~mrtpo_verl.workers.balanced_split.dispatch_balanced`;
2. **replay stage**: the rest of :meth:`~mrtpo_verl.trainer.replay_stage.ReplayStage.run` (relevance out of the
   answer, its metrics);
3. **estimator**: the relevance put in the step's ``DataProto`` and the ``mrtpo`` estimator run through verl's own
   ``compute_advantage`` inside :func:`~mrtpo_verl.advantage_inputs.advantage_inputs`, as the trainer does.

No model and no Ray: the ranks' answers are made in the driver process, so Ray's object-store transfer is not
included (its buffers come on top on a real driver). The request the driver dispatches (token ids and masks, not
relevance) is kept alive until the end, so that the growth measured is the relevance's.

Method: one fresh subprocess per allocator setting. At the start of each stage the kernel's peak-RSS mark is reset
(``/proc/self/clear_refs`` ← 5); at its end ``VmHWM`` minus the RSS just before the ranks' answers were made is
that stage's peak growth. Figures are multiples of one copy of the tensor (bs × K × L × 4 bytes); a calibration
row allocates and fills one copy in the same process. Two settings: glibc as a driver runs it (it keeps freed
blocks of up to 32 MiB for reuse, so RSS also shows the (bs, L) temporaries it has not returned), and glibc
returning every freed block over 64 KiB at once (``MALLOC_MMAP_THRESHOLD_=65536``: RSS follows the bytes alive).
For scale, the last row is verl's own ``gdpo`` estimator on the same batch: the (bs, L) work both estimators do.
Target: the whole path's peak ≤ 1.5 copies.

    python -m benchmarks.driver_memory            # bs = 1024, K = 3, L = 4096 (one copy = 48 MiB), ~1.5 min
    python -m benchmarks.driver_memory --quick    # bs = 64, K = 3, L = 512: a smoke run, figures not meaningful
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks.machine import machine_description

MIB = 1024 * 1024
TARGET = 1.5
STAGES = ("merge", "replay stage", "estimator")
#: Child environments: glibc as a driver runs it, and glibc returning every freed block over 64 KiB at once (the
#: RSS then follows the bytes alive; by default glibc keeps freed blocks of up to 32 MiB for reuse).
ALLOCATORS = {"default glibc": {}, "live bytes": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


def _vm_kib(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


class PeakMeter:
    """Peak RSS growth per stage, from ``VmHWM`` reset at each stage's start (Linux ``clear_refs``).

    Each stage's peak is recorded over the path's start (what the driver holds at worst) and over the stage's own
    start (what the stage adds to what earlier stages left).
    """

    def __init__(self) -> None:
        self.start_kib = 0
        self.stage_start_kib = 0
        self.peaks: dict[str, int] = {}
        self.own: dict[str, int] = {}

    @staticmethod
    def reset_peak() -> None:
        Path("/proc/self/clear_refs").write_text("5")

    def start(self) -> None:
        self.reset_peak()
        self.start_kib = self.stage_start_kib = _vm_kib("VmRSS")

    def mark(self, stage: str) -> None:
        """Record the stage's peak growth, and start the next stage's peak."""
        peak = _vm_kib("VmHWM")
        self.peaks[stage] = (peak - self.start_kib) * 1024
        self.own[stage] = (peak - self.stage_start_kib) * 1024
        self.reset_peak()
        self.stage_start_kib = _vm_kib("VmRSS")

    def held(self) -> int:
        return (_vm_kib("VmRSS") - self.start_kib) * 1024


def build_batch(batch_size: int, num_rewards: int, length: int, prompt_length: int, group: int) -> Any:
    """The step's ``DataProto`` as the advantage step builds it: full-length responses, every reward varying."""
    import numpy as np
    import torch
    from verl.protocol import DataProto

    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 1000, (batch_size, prompt_length), generator=generator)
    responses = torch.randint(10, 1000, (batch_size, length), generator=generator)
    response_mask = torch.ones(batch_size, length, dtype=torch.long)
    attention_mask = torch.ones(batch_size, prompt_length + length, dtype=torch.long)
    scores = torch.zeros(batch_size, length)
    scores[:, -1] = 1.0
    rng = np.random.default_rng(0)
    non_tensors: dict[str, Any] = {"uid": np.array([f"g{row // group}" for row in range(batch_size)], dtype=object)}
    for k in range(num_rewards):
        non_tensors[f"r{k}"] = rng.random(batch_size).astype(np.float32)
        texts = [f"verifier text {k} of group {row // group}" for row in range(batch_size)]
        non_tensors[f"r{k}_info"] = np.array(texts, dtype=object)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": attention_mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)


class SyntheticRanks:
    """A DP-dispatched worker-group method as the driver sees it: verl's chunks, each rank's answer, the collect.

    Each rank answers ``mrtpo_relevance`` (rows, K, L) float32 (random, 0 where ``response_mask`` is 0), the
    counters and its time in ``meta_info["metrics"]``, as :class:`~mrtpo_verl.workers.replay_worker.ReplayWorker`
    does. The list of answers goes to the collect function registered on ``ReplayWorker.compute_relevance``, as
    verl's worker-group call passes the list ``ray.get`` returned.
    """

    def __init__(self, ranks: int, num_rewards: int, meter: PeakMeter) -> None:
        self.ranks = ranks
        self.num_rewards = num_rewards
        self.meter = meter
        self.request: Any = None

    def __call__(self, request: Any) -> Any:
        import torch
        from verl.protocol import DataProto
        from verl.single_controller.base.decorator import MAGIC_ATTR

        from mrtpo_verl.batch_keys import COUNTER_KEYS, RANK_TIME_METRIC, RELEVANCE_KEY
        from mrtpo_verl.workers.replay_worker import ReplayWorker

        collect = getattr(ReplayWorker.compute_relevance, MAGIC_ATTR)["dispatch_mode"]["collect_fn"]
        self.request = request  # held to the end: the growth measured is the answer's
        self.meter.start()
        answers = []
        generator = torch.Generator().manual_seed(1)
        for chunk in request.chunk(self.ranks):
            mask = chunk.batch["response_mask"]
            relevance = torch.rand(len(chunk), self.num_rewards, mask.shape[1], generator=generator)
            relevance.mul_(mask[:, None, :])
            counters = {key: torch.zeros(len(chunk), dtype=torch.float64) for key in COUNTER_KEYS}
            answer = DataProto.from_dict(tensors={RELEVANCE_KEY: relevance} | counters)
            answer.meta_info["metrics"] = {RANK_TIME_METRIC: 0.0}
            answers.append(answer)
        del relevance, answer, counters
        return collect(SimpleNamespace(world_size=self.ranks), answers)


class SyntheticBackend:
    """A replay backend whose ranks are :class:`SyntheticRanks`, dispatched as the Ray backends dispatch."""

    name = "synthetic"

    def __init__(self, ranks: SyntheticRanks, meter: PeakMeter) -> None:
        self.ranks = ranks
        self.meter = meter

    def compute_relevance(self, request: Any) -> Any:
        from mrtpo_verl.workers.balanced_split import dispatch_balanced

        answer = dispatch_balanced(request, self.ranks.ranks, self.ranks)
        self.meter.mark("merge")
        return answer


def measure(batch_size: int, num_rewards: int, length: int, ranks: int) -> dict[str, Any]:
    """One run of the path in this process; peak growth per stage in bytes, and the calibration copy's."""
    import torch
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from mrtpo_verl.advantage_inputs import advantage_inputs
    from mrtpo_verl.batch_keys import RELEVANCE_KEY
    from mrtpo_verl.config import MRTPOConfig
    from mrtpo_verl.trainer.replay_stage import ReplayStage

    torch.set_num_threads(1)
    meter = PeakMeter()
    meter.start()
    copy = torch.rand(batch_size, num_rewards, length)
    calibration = meter.held()
    del copy

    reward_keys = tuple(f"r{k}" for k in range(num_rewards))
    cfg = MRTPOConfig.from_block(
        {"reward_keys": list(reward_keys), "verifier_info_keys": [f"{key}_info" for key in reward_keys]}
    )
    algo = AlgoConfig(adv_estimator="mrtpo", gdpo_reward_keys=list(reward_keys))
    data = build_batch(batch_size, num_rewards, length, prompt_length=64, group=8)
    stage = ReplayStage(cfg, algo, SyntheticBackend(SyntheticRanks(ranks, num_rewards, meter), meter))

    relevance, _ = stage.run(data, global_step=100)
    meter.mark("replay stage")
    data.batch[RELEVANCE_KEY] = relevance
    del relevance
    with advantage_inputs(data, cfg, global_step=100):
        data = compute_advantage(data, adv_estimator="mrtpo", config=algo)
    meter.mark("estimator")
    if not bool(torch.isfinite(data.batch["advantages"]).all()):
        raise RuntimeError("the estimator gave non-finite advantages")
    held = meter.held()

    # verl's gdpo on the same batch without relevance: the (bs, L) work every multi-reward estimator does.
    gdpo_data = data.slice(0, len(data))
    gdpo_data.batch.pop(RELEVANCE_KEY)
    gdpo_algo = AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(reward_keys))
    meter.mark("between")
    compute_advantage(gdpo_data, adv_estimator="gdpo", config=gdpo_algo)
    meter.mark("gdpo estimator")
    return {
        "copy_bytes": batch_size * num_rewards * length * 4,
        "calibration_bytes": calibration,
        "peaks": meter.peaks,
        "own": meter.own,
        "held_bytes": held,
    }


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """One row per stage, one column pair per allocator setting: growth in MiB and in copies of the tensor."""
    names = list(results)
    first = results[names[0]]
    copy = first["copy_bytes"]

    def cells(value_of: Any) -> str:
        return " | ".join(f"{value_of(r) / MIB:,.1f} MiB | {value_of(r) / copy:.2f}×" for r in results.values())

    header = " | ".join(f"{name}: MiB | {name}: × one copy" for name in names)
    lines = [f"| stage | {header} |", "|---" * (1 + 2 * len(names)) + "|"]
    lines.append(f"| one copy, allocated and filled (calibration) | {cells(lambda r: r['calibration_bytes'])} |")
    for stage in STAGES:
        lines.append(f"| {stage}: peak over the path's start | {cells(lambda r, s=stage: r['peaks'][s])} |")
    lines.append(f"| **whole path** (max of the stages) | {cells(lambda r: max(r['peaks'][s] for s in STAGES))} |")
    lines.append(f"| held after the estimator (relevance, advantages) | {cells(lambda r: r['held_bytes'])} |")
    lines.append(f"| mrtpo estimator: its own peak over its start | {cells(lambda r: r['own']['estimator'])} |")
    lines.append(
        f"| verl's gdpo estimator, same batch: its own peak over its start | "
        f"{cells(lambda r: r['own']['gdpo estimator'])} |"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="bs 64, L 512: a smoke run")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rewards", type=int, default=3)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.length = 64, 512
    if args.child:
        print(json.dumps(measure(args.batch_size, args.rewards, args.length, args.ranks)))
        return 0
    shown = ["--quick"] if args.quick else (argv if argv is not None else sys.argv[1:])
    for line in machine_description("benchmarks.driver_memory", list(shown)):
        print(line)
    sizes = ["--batch-size", str(args.batch_size), "--rewards", str(args.rewards), "--length", str(args.length)]
    child = [sys.executable, "-m", "benchmarks.driver_memory", "--child", *sizes, "--ranks", str(args.ranks)]
    results = {}
    for name, extra_env in ALLOCATORS.items():
        env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")} | extra_env
        done = subprocess.run(
            child, capture_output=True, text=True, check=False, cwd=Path(__file__).parent.parent, env=env
        )
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    copy = results[next(iter(results))]["copy_bytes"]
    print(
        f"relevance (bs, K, L) = ({args.batch_size}, {args.rewards}, {args.length}) float32: one copy = "
        f"{copy / MIB:,.1f} MiB; {args.ranks} ranks; target: whole path ≤ {TARGET}× (live bytes)"
    )
    for line in table(results):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Colocated replay on verl's real actor worker: two FSDP2 ranks on gloo, one Ray worker group.

verl's ``ActorRolloutRefWorker`` (our subclass, role ``actor``) builds its real FSDP2 engine on CPU
through :mod:`mrtpo_cpu`; ``compute_mrtpo_relevance`` then replays on the engine's
sharded model in place. Checked against the in-process scorer on the same weights:

- every pair needed: the same relevance (each rank scores its own rows);
- one row needed: one rank has work and the other none, so the idle rank must run idle forward
  passes to keep FSDP's all-gathers in step (without them the busy rank would wait forever);
- both a tied LM head (SmolLM2, in FSDP's root group) and an untied one (sharded on its own);
- prefix sharing on the colocated side (each shared prefix's cache built by a call of the wrapped root module,
  one more collective pass that every rank counts) against the unshared in-process path;
- a rank that fails between forward passes (after the ranks agreed on their number) stops every rank at the next
  collective with its own message, for ``on_worker_failure=error`` and ``uniform``.

The failing rank is made by a test-only hook (``FaultyActorWorker`` in tests/support/actor_groups.py, not in the
package): it puts NaN into one rank's hidden states, and the scorer's own NaN check then raises on that rank.
verl's engine options are checked in test_colocated_engine_options_on_cpu.py.

The only stand-in: Ray's placement groups ask for GPUs, so the cluster declares two logical GPUs; every tensor
lives on the CPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from mrtpo_cpu.launch import save_derived_model
from mrtpo_verl.batch_keys import RANK_TIME_METRIC, RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.replay.model_runners import PeerFailed
from mrtpo_verl.trainer.replay_stage import ReplayStage, ReplayWorkerFailed, build_request
from mrtpo_verl.workers.placement import ColocatedBackend, InProcessBackend
from tests.support.actor_groups import (
    CFG,
    RANKS,
    UNSHARED,
    relevance_of,
    started_actor_group,
)
from tests.support.actor_groups import cpu_ray_cluster as cpu_ray_cluster_for
from tests.support.ray_groups import release
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # a collective out of step would hang: fail instead


@pytest.fixture(scope="module")
def cpu_ray_cluster():
    with cpu_ray_cluster_for(RANKS):
        yield


def untie_lm_head(model_dir: Path) -> Path:
    """The same weights with ``tie_word_embeddings=False``: FSDP2 then shards the LM head on its own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    out = model_dir.parent / f"{model_dir.name}_untied"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["tied", "untied"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tied = save_derived_model(tmp_path_factory.mktemp("colocated") / "model", num_layers=2)
    return tied if request.param == "tied" else untie_lm_head(tied)


@pytest.fixture(scope="module")
def actor_group(cpu_ray_cluster, model_dir: Path):
    with started_actor_group(model_dir) as group:
        yield group


@pytest.fixture(scope="module")
def in_process(model_dir: Path) -> InProcessBackend:
    from mrtpo_verl.replay.model_loading import load_causal_lm

    model, tokenizer = load_causal_lm(str(model_dir), dtype=torch.float32)
    return InProcessBackend(UNSHARED, model, tokenizer)


def test_all_pairs_match_the_in_process_scorer(actor_group, in_process: InProcessBackend) -> None:
    data = real_sql_batch()
    needed = ReplayStage(CFG, None, backend=None).needed_pairs(data)
    assert needed.all(), "the real batch has work for every pair"
    answer = ColocatedBackend(actor_group, CFG).compute_relevance(build_request(data, CFG, needed))
    expected = in_process.compute_relevance(build_request(data, CFG, needed))

    torch.testing.assert_close(answer.batch[RELEVANCE_KEY], expected.batch[RELEVANCE_KEY], atol=1e-5, rtol=0)
    assert float(answer.batch["mrtpo_forward_passes"].sum()) == len(data) * (1 + len(REWARD_KEYS))
    assert len(answer.meta_info["metrics"][RANK_TIME_METRIC]) == RANKS  # both ranks worked and reported
    shared = float(answer.batch["mrtpo_prefix_tokens_shared"].sum())
    assert shared > 0 and float(expected.batch["mrtpo_prefix_tokens_shared"].sum()) == 0
    replayed = float(answer.batch["mrtpo_tokens_replayed"].sum())
    assert replayed + shared == float(expected.batch["mrtpo_tokens_replayed"].sum())  # same passes, fewer tokens


def test_a_rank_without_work_keeps_the_busy_rank_in_step(actor_group, in_process: InProcessBackend) -> None:
    data = real_sql_batch()
    needed = torch.zeros(len(data), len(REWARD_KEYS), dtype=torch.bool)
    needed[0] = True  # one row of work: after the balanced split one rank has all of it, the other none
    answer = ColocatedBackend(actor_group, CFG).compute_relevance(build_request(data, CFG, needed))
    expected = in_process.compute_relevance(build_request(data, CFG, needed))

    torch.testing.assert_close(answer.batch[RELEVANCE_KEY], expected.batch[RELEVANCE_KEY], atol=1e-5, rtol=0)
    assert (answer.batch[RELEVANCE_KEY][1:] == 0).all() and answer.batch[RELEVANCE_KEY][0].abs().sum() > 0
    assert float(answer.batch["mrtpo_forward_passes"].sum()) == 1 + len(REWARD_KEYS)
    # The three other rows were skipped whole; the padding rows are not counted.
    assert float(answer.batch["mrtpo_skipped_passes"].sum()) == (len(data) - 1) * (1 + len(REWARD_KEYS))


def test_a_rank_that_fails_before_its_passes_does_not_leave_the_other_waiting(actor_group) -> None:
    data = real_sql_batch()
    request = build_request(data, CFG, torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool))
    request.non_tensor_batch[INFO_KEYS[0]] = request.non_tensor_batch[INFO_KEYS[0]].copy()
    request.non_tensor_batch[INFO_KEYS[0]][3] = 123  # one row's verifier text is not a string: one rank fails
    with pytest.raises(Exception, match=r"must be a string or None, got int|another rank failed") as raised:
        ColocatedBackend(actor_group, CFG).compute_relevance(request)
    assert "Timeout" not in type(raised.value).__name__
    # The group is still usable: both ranks left the failed call in step.
    answer = ColocatedBackend(actor_group, CFG).compute_relevance(
        build_request(data, CFG, torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool))
    )
    assert float(answer.batch["mrtpo_forward_passes"].sum()) == len(data) * (1 + len(REWARD_KEYS))


FAILING = MRTPOConfig(
    reward_keys=REWARD_KEYS,
    verifier_info_keys=INFO_KEYS,
    replay=ReplayConfig(micro_batch_size=2, skip_zero_advantage=False, on_worker_failure="error"),
)
UNIFORM_ON_FAILURE = MRTPOConfig(
    reward_keys=REWARD_KEYS,
    verifier_info_keys=INFO_KEYS,
    replay=ReplayConfig(micro_batch_size=2, skip_zero_advantage=False, on_worker_failure="uniform"),
)
#: A failed step must end well within this on every rank (without the per-pass meeting it never ends).
FAILURE_BOUND_S = 120.0


def test_a_rank_failing_between_passes_stops_every_rank_with_its_own_message(
    actor_group, model_dir, in_process: InProcessBackend
) -> None:
    if model_dir.name.endswith("_untied"):
        pytest.skip("the failure path does not depend on how the LM head is sharded: checked on the tied model")
    data = real_sql_batch()
    actor_group.poison_replay_pass(1, 1)  # rank 1's first pass: its NaN check raises after the agreement
    start = time.monotonic()
    with pytest.raises(ReplayWorkerFailed) as raised:
        ReplayStage(FAILING, None, ColocatedBackend(actor_group, FAILING)).run(data, global_step=7)
    assert time.monotonic() - start < FAILURE_BOUND_S
    message = str(raised.value)
    assert "failed at global step 7" in message and "have no valid distribution (a NaN" in message, message
    # rank 0 was stopped by rank 1's report, not by a timeout; if Ray shows rank 0's error, it names rank 1's.
    assert "Timeout" not in message and ("rank 1: ValueError" in message or "PeerFailed" not in message), message

    # The ranks left the failed request in step: the next one runs and is right.
    needed = torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool)
    expected = in_process.compute_relevance(build_request(data, UNSHARED, needed)).batch[RELEVANCE_KEY]
    torch.testing.assert_close(relevance_of(actor_group, data), expected, atol=1e-5, rtol=0)


def test_a_rank_failing_between_passes_gives_uniform_weights_when_asked(actor_group, model_dir) -> None:
    if model_dir.name.endswith("_untied"):
        pytest.skip("the failure path does not depend on how the LM head is sharded: checked on the tied model")
    data = real_sql_batch()
    actor_group.poison_replay_pass(0, 2)  # this time rank 0, on its second pass
    start = time.monotonic()
    relevance, metrics = ReplayStage(UNIFORM_ON_FAILURE, None, ColocatedBackend(actor_group, UNIFORM_ON_FAILURE)).run(
        data, global_step=8
    )
    assert time.monotonic() - start < FAILURE_BOUND_S
    assert metrics["mrtpo/replay/failed"] == 1.0 and (relevance == 0).all()  # q = 0: uniform token weights
    assert relevance_of(actor_group, data).abs().sum() > 0  # and the group goes on


def test_peer_failed_names_every_failed_rank() -> None:
    error = PeerFailed([(1, "ValueError: bad row 3"), (3, "OutOfMemoryError: 2 GiB")], rank=0)
    assert "rank 1: ValueError: bad row 3; rank 3: OutOfMemoryError: 2 GiB" in str(error)
    assert "rank 0 stopped with it" in str(error)


def test_weights_for_the_dedicated_pool_are_gathered_on_rank_0_only(actor_group, model_dir: Path) -> None:
    """``mrtpo_state_dict``: rank 0 gets every full tensor (FSDP2 shards sent to it), rank 1 nothing; any dtype."""
    from transformers import AutoModelForCausalLM

    from mrtpo_verl.workers.weight_gather import StoredTensor, load_stored

    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        on_rank_0, on_rank_1 = actor_group.mrtpo_state_dict(dtype_name)
        assert on_rank_1 is None
        assert all(isinstance(value, StoredTensor) for value in on_rank_0.values())  # references, not tensors
        on_rank_0 = load_stored(on_rank_0)
        assert set(reference) - set(on_rank_0) <= {"lm_head.weight"} and set(on_rank_0) <= set(reference)
        for name, tensor in on_rank_0.items():
            assert tensor.dtype == dtype and tensor.device.type == "cpu", name
            assert torch.equal(tensor, reference[name].to(dtype)), name


def test_a_dedicated_pool_scores_with_the_weights_the_actor_sends(actor_group, model_dir: Path, in_process) -> None:
    """The dedicated placement end to end: a replay worker started from other weights gets the actor's from rank 0
    (object-store references, fp32) and then gives the in-process relevance of the actor's model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mrtpo_verl.workers.placement import DedicatedBackend, actor_weights, create_replay_worker_group

    if model_dir.name.endswith("_untied"):
        pytest.skip("the weight sync does not depend on how the LM head is sharded: checked on the tied model")
    other = model_dir.parent / "other_weights"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)
    model.save_pretrained(other)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(other)

    data = real_sql_batch()
    needed = torch.ones(len(data), len(REWARD_KEYS), dtype=torch.bool)
    expected = in_process.compute_relevance(build_request(data, UNSHARED, needed)).batch[RELEVANCE_KEY]
    group = create_replay_worker_group(CFG, str(other), [1], "cpu", dtype="fp32")
    try:
        backend = DedicatedBackend(group, weight_source=lambda: actor_weights(actor_group, "fp32"))
        before = backend.compute_relevance(build_request(data, CFG, needed)).batch[RELEVANCE_KEY]
        assert (before - expected).abs().max() > 1e-3, "the worker starts from other weights"
        metrics = backend.before_step(global_step=1)
        assert metrics["mrtpo/replay/weight_sync_s"] > 0
        after = backend.compute_relevance(build_request(data, CFG, needed)).batch[RELEVANCE_KEY]
    finally:
        release(group)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=0)

"""The replay stage on a real batch (SmolLM2 answers to Spider questions, scored by our SQL verifier),
then verl's own compute_advantage with the mrtpo estimator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.ray_trainer import compute_advantage

from mrtpo_verl.advantage_inputs import advantage_inputs
from mrtpo_verl.batch_keys import COUNTER_KEYS, RELEVANCE_KEY
from mrtpo_verl.config import MRTPOConfig, ReplayConfig
from mrtpo_verl.trainer.replay_stage import ReplayStage, ReplayWorkerFailed
from mrtpo_verl.workers.placement import InProcessBackend
from tests.support.real_batch import INFO_KEYS, REWARD_KEYS, real_sql_batch, smollm2

pytestmark = pytest.mark.slow


def mrtpo_config(**replay: object) -> MRTPOConfig:
    return MRTPOConfig(
        reward_keys=REWARD_KEYS,
        verifier_info_keys=INFO_KEYS,
        warmup_steps=0,
        replay=ReplayConfig(micro_batch_size=4, **replay),
    )  # type: ignore[arg-type]


def algo() -> AlgoConfig:
    return AlgoConfig(adv_estimator="gdpo", gdpo_reward_keys=list(REWARD_KEYS))


@pytest.fixture(scope="module")
def stage_result():
    data = real_sql_batch()
    model, tokenizer = smollm2()
    cfg = mrtpo_config()
    stage = ReplayStage(cfg, algo(), InProcessBackend(cfg, model, tokenizer))
    relevance, metrics = stage.run(data, global_step=3)
    return data, cfg, relevance, metrics


def test_stage_returns_bounded_relevance_on_valid_tokens(stage_result) -> None:
    data, _, relevance, metrics = stage_result
    mask = data.batch["response_mask"].bool()
    assert relevance.shape == (len(data), len(REWARD_KEYS), mask.shape[1])
    assert (relevance >= 0).all() and (relevance <= 1).all()
    assert (relevance.permute(1, 0, 2)[:, ~mask] == 0).all()  # padding
    # Every reward varies in every group, so every pair is replayed and has some relevant token.
    assert (relevance.amax(dim=2) > 0).all()
    assert metrics["mrtpo/replay/forward_passes"] == len(data) * (1 + len(REWARD_KEYS))
    assert metrics["mrtpo/replay/skip_fraction"] == 0.0
    assert metrics["mrtpo/replay/tokens_replayed"] > 0 and metrics["mrtpo/replay/time_s"] > 0
    for key in REWARD_KEYS:
        assert 0.1 <= metrics[f"mrtpo/{key}/relevance_top10_share"] <= 1.0


def test_end_to_end_advantages_through_verls_compute_advantage(stage_result) -> None:
    data, cfg, relevance, _ = stage_result
    gdpo = compute_advantage(data.slice(0, len(data)), adv_estimator="gdpo", config=algo()).batch["advantages"]
    batch = data.slice(0, len(data))
    batch.batch[RELEVANCE_KEY] = relevance
    with advantage_inputs(batch, cfg, global_step=3) as inputs:
        mrtpo = compute_advantage(batch, adv_estimator="mrtpo", config=algo()).batch["advantages"]
    mask = data.batch["response_mask"].bool()
    assert torch.isfinite(mrtpo).all() and (mrtpo[~mask] == 0).all()
    assert not torch.allclose(mrtpo, gdpo)
    # Credit moves inside each response; each response keeps its total.
    assert torch.allclose(mrtpo.sum(1), gdpo.sum(1), atol=1e-4)
    # GDPO gives one value per response; MRTPO varies along the response where relevance varies.
    assert all(mrtpo[i][mask[i]].std() > 0 for i in range(len(data)))
    assert inputs.metrics["mrtpo/beta"] == 0.5


def test_skipping_is_exact(stage_result) -> None:
    """Make sql_execution constant in group q1: its pairs are skipped, everything else is unchanged."""
    data = stage_result[0]
    model, tokenizer = smollm2()
    batch = data.slice(0, len(data))
    batch.non_tensor_batch["sql_execution"] = np.array([0.0, 1.0, 1.0, 1.0])  # group q1 = rows 2, 3
    results = {}
    for skip in (True, False):
        cfg = mrtpo_config(skip_zero_advantage=skip)
        stage = ReplayStage(cfg, algo(), InProcessBackend(cfg, model, tokenizer))
        results[skip] = stage.run(batch, global_step=3)
    (q_skip, m_skip), (q_all, m_all) = results[True], results[False]
    assert m_skip["mrtpo/replay/forward_passes"] == m_all["mrtpo/replay/forward_passes"] - 2
    assert m_skip["mrtpo/replay/skip_fraction"] == pytest.approx(2 / 12)
    # Equal up to float rounding: with prefix sharing (the default) skipping changes which passes share a cached
    # prefix, so the same numbers are summed in another order (bitwise equal with share_prefix=false).
    torch.testing.assert_close(q_skip[:, 0], q_all[:, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(q_skip[:2], q_all[:2], atol=1e-5, rtol=0)
    assert (q_skip[2:, 1] == 0).all() and (q_all[2:, 1] > 0).any()
    advantages = []
    for q in (q_skip, q_all):
        b = batch.slice(0, len(batch))
        b.batch[RELEVANCE_KEY] = q
        with advantage_inputs(b, mrtpo_config(), global_step=3):
            advantages.append(compute_advantage(b, adv_estimator="mrtpo", config=algo()).batch["advantages"])
    torch.testing.assert_close(advantages[0], advantages[1], atol=1e-4, rtol=0)


def test_missing_verifier_information_fails_before_any_replay() -> None:
    class MustNotRun:
        name = "must-not-run"

        def compute_relevance(self, request):  # pragma: no cover - reaching it is the failure
            raise AssertionError("replay ran although verifier information is missing")

    batch = real_sql_batch().slice(0, 4)
    del batch.non_tensor_batch["sql_execution_info"]
    with pytest.raises(KeyError, match=r"no verifier information \['sql_execution_info'\]"):
        ReplayStage(mrtpo_config(), algo(), MustNotRun()).run(batch, global_step=1)


class FailingBackend:
    """Stands for a worker group whose worker died: raises like Ray does (RayActorError is an Exception)."""

    name = "mrtpo_replay"

    def compute_relevance(self, request):
        raise RuntimeError("The actor died unexpectedly before finishing this task (mrtpo_replayReplayWorker_0:0)")


def test_worker_failure_names_the_group_and_step() -> None:
    with pytest.raises(ReplayWorkerFailed, match=r"'mrtpo_replay' failed at global step 7.*ReplayWorker_0:0"):
        ReplayStage(mrtpo_config(), algo(), FailingBackend()).run(real_sql_batch(), global_step=7)


def test_worker_failure_falls_back_to_uniform_when_configured() -> None:
    data = real_sql_batch()
    cfg = mrtpo_config(on_worker_failure="uniform")
    relevance, metrics = ReplayStage(cfg, algo(), FailingBackend()).run(data, global_step=7)
    assert metrics["mrtpo/replay/failed"] == 1.0
    batch = data.slice(0, len(data))
    batch.batch[RELEVANCE_KEY] = relevance
    with advantage_inputs(batch, cfg, global_step=7):
        fallback = compute_advantage(batch, adv_estimator="mrtpo", config=algo()).batch["advantages"]
    gdpo = compute_advantage(data.slice(0, len(data)), adv_estimator="gdpo", config=algo()).batch["advantages"]
    assert torch.allclose(fallback, gdpo, atol=1e-6)


class FixedAnswerBackend:
    """Stands for a worker group whose ranks answered ``relevance`` (what verl's DP collect hands the driver)."""

    name = "fixed_answer"

    def __init__(self, relevance: torch.Tensor) -> None:
        self.relevance = relevance

    def compute_relevance(self, request):
        counters = {key: torch.zeros(len(request), dtype=torch.float64) for key in COUNTER_KEYS}
        return DataProto.from_dict(tensors={RELEVANCE_KEY: self.relevance} | counters)


def test_stage_returns_the_answers_own_tensor_and_refuses_another_dtype() -> None:
    data = real_sql_batch()
    shape = (len(data), len(REWARD_KEYS), data.batch["response_mask"].shape[1])
    answered = torch.rand(shape)
    relevance, _ = ReplayStage(mrtpo_config(), algo(), FixedAnswerBackend(answered)).run(data, global_step=3)
    assert relevance.data_ptr() == answered.data_ptr()  # no copy of the (bs, K, L) tensor on the driver
    with pytest.raises(ReplayWorkerFailed, match=r"'fixed_answer' answered mrtpo_relevance as torch.float64"):
        ReplayStage(mrtpo_config(), algo(), FixedAnswerBackend(answered.double())).run(data, global_step=3)

"""The replay methods' collect: verl's concatenation of the ranks' answers, each answer released as it is copied."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.single_controller.base.decorator import MAGIC_ATTR

from mrtpo_verl.batch_keys import RANK_TIME_METRIC, RELEVANCE_KEY
from mrtpo_verl.workers.actor_worker import MRTPOActorRolloutRefWorker
from mrtpo_verl.workers.balanced_split import dispatch_balanced
from mrtpo_verl.workers.collect import DP_COMPUTE_PROTO_RELEASING, concat_releasing
from mrtpo_verl.workers.replay_worker import ReplayWorker
from tests.trainer.test_balanced_split_on_cpu import request_of


def rank_answers(sizes: list[int], seed: int = 0) -> list[DataProto]:
    """Answers shaped like the replay's: (rows, K, L) float32 relevance, float64 counters, labels, rank time."""
    generator = torch.Generator().manual_seed(seed)
    answers = []
    for rank, rows in enumerate(sizes):
        answer = DataProto.from_dict(
            tensors={
                RELEVANCE_KEY: torch.rand(rows, 3, 7, generator=generator),
                "count": torch.randint(0, 9, (rows,), generator=generator).double(),
                "flag": torch.rand(rows, 2, generator=generator) > 0.5,
            },
            non_tensors={"label": np.array([f"rank {rank} row {i}" for i in range(rows)], dtype=object)},
            meta_info={"step": 3},
        )
        answer.meta_info["metrics"] = {RANK_TIME_METRIC: 0.5 + rank}
        answers.append(answer)
    return answers


def assert_same(ours: DataProto, verl: DataProto) -> None:
    assert list(ours.batch.keys()) == list(verl.batch.keys()) and ours.batch.batch_size == verl.batch.batch_size
    for key in verl.batch.keys():  # noqa: SIM118  (TensorDict)
        assert ours.batch[key].dtype == verl.batch[key].dtype and torch.equal(ours.batch[key], verl.batch[key]), key
    assert ours.non_tensor_batch.keys() == verl.non_tensor_batch.keys()
    for key, values in verl.non_tensor_batch.items():
        assert ours.non_tensor_batch[key].tolist() == values.tolist()
    assert ours.meta_info == verl.meta_info


@pytest.mark.parametrize("sizes", [[4, 4, 4, 4], [3, 0, 5], [1]])
def test_the_result_is_verls_concat_and_the_list_is_emptied(sizes: list[int]) -> None:
    answers = rank_answers(sizes)
    expected = DataProto.concat(rank_answers(sizes))
    merged = concat_releasing(answers)
    assert answers == []
    assert_same(merged, expected)
    assert merged.meta_info["metrics"] == {RANK_TIME_METRIC: [0.5 + rank for rank in range(len(sizes))]}


def test_each_answer_is_released_before_the_next_is_copied() -> None:
    answers = rank_answers([5, 5, 5, 5])
    alive = [weakref.ref(answer.batch[RELEVANCE_KEY]) for answer in answers]
    released_at: list[list[bool]] = []

    class Watched(list):  # records, at each answer's release, which earlier answers are gone
        def __setitem__(self, index, value) -> None:  # type: ignore[no-untyped-def]
            released_at.append([ref() is None for ref in alive[:index]])
            super().__setitem__(index, value)

    watched = Watched(answers)
    del answers
    concat_releasing(watched)
    assert released_at == [[], [True], [True, True], [True, True, True]]
    assert all(ref() is None for ref in alive)


def test_answers_that_do_not_match_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no answers"):
        concat_releasing([])
    with pytest.raises(TypeError, match="answer 1 is a NoneType"):
        concat_releasing([*rank_answers([2]), None])
    first, second = rank_answers([2, 2])
    second.batch[RELEVANCE_KEY] = second.batch[RELEVANCE_KEY].double()
    with pytest.raises(ValueError, match=r"answer 1's 'mrtpo_relevance' is \(2, 3, 7\) torch.float64"):
        concat_releasing([first, second])
    first, second = rank_answers([2, 2])
    second.batch.pop("count")
    with pytest.raises(ValueError, match="answer 1 has tensors"):
        concat_releasing([first, second])


def test_answers_without_tensors_are_merged_as_verl_merges_them() -> None:
    answers = [DataProto(non_tensor_batch={}, meta_info={"metrics": {"t": float(rank)}}) for rank in range(3)]
    merged = concat_releasing(answers)
    assert merged.batch is None and merged.meta_info == {"metrics": {"t": [0.0, 1.0, 2.0]}} and answers == []


def test_both_replay_methods_are_registered_with_the_releasing_collect() -> None:
    dedicated = getattr(ReplayWorker.compute_relevance, MAGIC_ATTR)["dispatch_mode"]
    assert dedicated is DP_COMPUTE_PROTO_RELEASING
    colocated = getattr(MRTPOActorRolloutRefWorker.compute_mrtpo_relevance, MAGIC_ATTR)["dispatch_mode"]
    assert isinstance(colocated, dict) and set(colocated) == {"dispatch_fn", "collect_fn"}


def test_dispatch_balanced_answers_in_request_order_through_the_registered_collect() -> None:
    """The dedicated replay's call as the driver makes it: verl's chunks, the registered collect, the reordering."""
    request = request_of([[True, False]] * 5 + [[True, True]] * 3, [4] * 8, [3, 1, 2, 3, 1, 2, 3, 1])
    collect = DP_COMPUTE_PROTO_RELEASING["collect_fn"]
    collected: list[DataProto] = []

    def dp_call(padded: DataProto) -> DataProto:
        answers = []
        for chunk in padded.chunk(2):
            rows = chunk.batch["row"].float()
            answer = DataProto.from_dict(tensors={RELEVANCE_KEY: rows[:, None, None].expand(-1, 2, 3).clone()})
            answer.meta_info["metrics"] = {RANK_TIME_METRIC: 1.0}
            answers.append(answer)
        collected.append(collect(SimpleNamespace(world_size=2), answers))
        return collected[0]

    answer = dispatch_balanced(request, 2, dp_call)
    assert answer.batch[RELEVANCE_KEY][:, 0, 0].tolist() == list(range(8))  # request order
    assert answer.batch[RELEVANCE_KEY].data_ptr() == collected[0].batch[RELEVANCE_KEY].data_ptr()  # no copy
    assert answer.meta_info["metrics"] == {RANK_TIME_METRIC: [1.0, 1.0]}

"""js_distance precision against a float64 reference: close rows, LLM-sized vocabularies, peaked rows, properties.

The distance is sqrt(JSD), so near-identical rows are where float32 error shows: these tests hold the
absolute distance error to 5e-7 (20x stricter than the 1e-5 of test_relevance_on_cpu.py) from distances
of ~1e-7 up to ~1, including at vocab 151,936.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mrtpo_verl.math.relevance import js_distance

ATOL = 5e-7


def float64_reference(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """Row-wise JS distance (base 2) in float64 straight from the definition, 0·log 0 = 0."""
    p = torch.softmax(logits_p.double(), dim=-1)
    q = torch.softmax(logits_q.double(), dim=-1)
    log_m = torch.log(0.5 * (p + q))

    def kl_to_midpoint(a: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * (torch.log(a) - log_m), torch.zeros_like(a)).sum(dim=-1)

    divergence = (0.5 * kl_to_midpoint(p) + 0.5 * kl_to_midpoint(q)) / math.log(2.0)
    return divergence.clamp(0.0, 1.0).sqrt()


def perturbed_pair(
    rows: int, vocab: int, scale: float, eps: float, peaked: bool, seed: int
) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    logits_p = torch.randn(rows, vocab, generator=generator) * scale
    if peaked:  # an LLM-like row: two dominant tokens over a long tail
        logits_p[:, 0] += 25.0
        logits_p[:, 1] += 22.0
    return logits_p, logits_p + eps * torch.randn(rows, vocab, generator=generator)


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.3, 3.0])
@pytest.mark.parametrize("peaked", [False, True])
@pytest.mark.parametrize("vocab", [1000, 49152])
def test_absolute_error_is_tiny_from_near_identical_to_far_rows(eps: float, peaked: bool, vocab: int) -> None:
    logits_p, logits_q = perturbed_pair(6, vocab, 3.0, eps, peaked, seed=int(eps * 1e6) + vocab)
    got = js_distance(logits_p, logits_q, chunk=4).double()
    torch.testing.assert_close(got, float64_reference(logits_p, logits_q), atol=ATOL, rtol=0)


@pytest.mark.parametrize(("scale", "eps"), [(3.0, 1e-4), (4.0, 1.0), (1.0, 5.0)])
def test_qwen_sized_vocabulary(scale: float, eps: float) -> None:
    """At vocab 151,936 torch's own softmax normaliser is off by up to 2e-5; the renormalisation keeps 5e-7."""
    logits_p, logits_q = perturbed_pair(3, 151936, scale, eps, peaked=False, seed=11)
    torch.testing.assert_close(
        js_distance(logits_p, logits_q).double(), float64_reference(logits_p, logits_q), atol=ATOL, rtol=0
    )


def test_bf16_at_llm_vocabulary_is_reduced_in_float32() -> None:
    logits_p, logits_q = perturbed_pair(4, 49152, 3.0, 0.05, peaked=True, seed=12)
    logits_p, logits_q = logits_p.bfloat16(), logits_q.bfloat16()
    got = js_distance(logits_p, logits_q, chunk=3).double()
    torch.testing.assert_close(got, float64_reference(logits_p.float(), logits_q.float()), atol=ATOL, rtol=0)


def test_masked_vocabulary_and_extremes_match_the_reference() -> None:
    generator = torch.Generator().manual_seed(13)
    logits_p = torch.randn(8, 3000, generator=generator) * 5
    logits_q = logits_p + 0.01 * torch.randn(8, 3000, generator=generator)
    logits_p[:, 100:900] = float("-inf")  # masked in P only, in Q only, in both
    logits_q[:, 500:1500] = float("-inf")
    logits_p[0, 2000] = 1e4  # one row dominated by a single extreme logit in P
    logits_q[1, 2500] = -1e4
    torch.testing.assert_close(
        js_distance(logits_p, logits_q, chunk=3).double(), float64_reference(logits_p, logits_q), atol=ATOL, rtol=0
    )


def test_each_row_matches_its_own_reference_whatever_its_neighbours() -> None:
    """Blocks mix near-identical, far and masked rows; every row keeps its own precision."""
    near_p, near_q = perturbed_pair(3, 2048, 3.0, 1e-5, peaked=True, seed=14)
    far_p, far_q = perturbed_pair(3, 2048, 3.0, 3.0, peaked=False, seed=15)
    logits_p, logits_q = torch.cat([near_p, far_p]), torch.cat([near_q, far_q])
    logits_q[4, :1000] = float("-inf")
    order = torch.tensor([3, 0, 4, 1, 5, 2])
    torch.testing.assert_close(
        js_distance(logits_p[order], logits_q[order], chunk=2).double(),
        float64_reference(logits_p[order], logits_q[order]),
        atol=ATOL,
        rtol=0,
    )


logit_rows = st.integers(min_value=2, max_value=40).flatmap(
    lambda vocab: st.tuples(
        st.lists(st.floats(-30, 30, width=32), min_size=vocab, max_size=vocab),
        st.lists(st.floats(-30, 30, width=32), min_size=vocab, max_size=vocab),
    )
)


@settings(max_examples=60, deadline=None)
@given(logit_rows, st.floats(-50, 50, width=32))
def test_properties_bounded_symmetric_shift_invariant(rows: tuple[list[float], list[float]], shift: float) -> None:
    logits_p = torch.tensor([rows[0]])
    logits_q = torch.tensor([rows[1]])
    distance = js_distance(logits_p, logits_q)
    assert 0.0 <= distance.item() <= 1.0
    torch.testing.assert_close(distance.double(), float64_reference(logits_p, logits_q), atol=ATOL, rtol=0)
    torch.testing.assert_close(js_distance(logits_q, logits_p), distance, atol=ATOL, rtol=0)
    torch.testing.assert_close(js_distance(logits_p + shift, logits_q), distance, atol=2e-6, rtol=0)
    assert js_distance(logits_p, logits_p.clone()).item() == 0.0


def test_blocks_smaller_than_chunk_on_cpu_give_the_same_result() -> None:
    """On CPU a block also holds at most 2^20 entries; how rows fall into blocks changes only the last bits.

    (Not bit for bit: with a single long row per block torch may split its sums across threads.)
    """
    generator = torch.Generator().manual_seed(16)
    logits_p = torch.randn(9, 300000, generator=generator)
    logits_q = torch.randn(9, 300000, generator=generator)
    whole = js_distance(logits_p, logits_q, chunk=256)  # 3 rows per block under the cap
    for chunk in (1, 2, 5):
        torch.testing.assert_close(js_distance(logits_p, logits_q, chunk=chunk), whole, atol=1e-7, rtol=0)

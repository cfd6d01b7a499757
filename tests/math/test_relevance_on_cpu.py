"""js_distance against an independent float64 reference (scipy), plus its numerical edge cases."""

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from mrtpo_verl.math.relevance import js_distance


def scipy_reference(logits_p: torch.Tensor, logits_q: torch.Tensor) -> np.ndarray:
    """Row-wise float64 JS distance (base 2) via scipy, from float64 softmaxes."""
    p = torch.softmax(logits_p.double(), dim=-1).numpy()
    q = torch.softmax(logits_q.double(), dim=-1).numpy()
    return np.array([jensenshannon(p[i], q[i], base=2) for i in range(p.shape[0])])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("n_tokens", "vocab", "chunk", "scale"), [(37, 100, 8, 1.0), (64, 1000, 64, 4.0), (5, 3, 2, 0.1)]
)
def test_matches_scipy_on_seeded_random_logits(seed: int, n_tokens: int, vocab: int, chunk: int, scale: float) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits_p = torch.randn(n_tokens, vocab, generator=generator) * scale
    logits_q = torch.randn(n_tokens, vocab, generator=generator) * scale
    got = js_distance(logits_p, logits_q, chunk=chunk).double().numpy()
    np.testing.assert_allclose(got, scipy_reference(logits_p, logits_q), atol=1e-5, rtol=0)


def test_close_distributions_keep_precision() -> None:
    """Small perturbations are where sqrt amplifies error; the log1p form keeps it within 1e-5."""
    generator = torch.Generator().manual_seed(3)
    logits_p = torch.randn(16, 500, generator=generator)
    logits_q = logits_p + 1e-2 * torch.randn(16, 500, generator=generator)
    got = js_distance(logits_p, logits_q).double().numpy()
    np.testing.assert_allclose(got, scipy_reference(logits_p, logits_q), atol=1e-5, rtol=0)
    assert (got > 0).all()


def test_bf16_input_is_reduced_in_float32() -> None:
    generator = torch.Generator().manual_seed(4)
    logits_p = (torch.randn(20, 300, generator=generator) * 2).bfloat16()
    logits_q = (torch.randn(20, 300, generator=generator) * 2).bfloat16()
    got = js_distance(logits_p, logits_q, chunk=7)
    assert got.dtype == torch.float32
    # The reference sees the same bf16-rounded logits, so only the reduction's precision is compared.
    np.testing.assert_allclose(got.double().numpy(), scipy_reference(logits_p.float(), logits_q.float()), atol=1e-5)


def test_identical_inputs_give_exactly_zero() -> None:
    logits = torch.randn(33, 257) * 10
    logits[:, :5] = float("-inf")
    assert torch.equal(js_distance(logits, logits.clone(), chunk=4), torch.zeros(33))


def test_extreme_logits_are_finite_and_bounded() -> None:
    generator = torch.Generator().manual_seed(5)
    logits_p = torch.randn(10, 64, generator=generator).sign() * 1e4
    logits_q = torch.randn(10, 64, generator=generator).sign() * 1e4
    got = js_distance(logits_p, logits_q)
    assert torch.isfinite(got).all() and (got >= 0).all() and (got <= 1).all()
    np.testing.assert_allclose(got.double().numpy(), scipy_reference(logits_p, logits_q), atol=1e-5)


def test_disjoint_supports_give_distance_one() -> None:
    logits_p = torch.full((2, 4), float("-inf"))
    logits_q = torch.full((2, 4), float("-inf"))
    logits_p[:, 0] = 0.0
    logits_q[:, 1] = 0.0
    assert torch.allclose(js_distance(logits_p, logits_q), torch.ones(2))


def test_masked_vocabulary_matches_reference() -> None:
    generator = torch.Generator().manual_seed(6)
    logits_p = torch.randn(12, 50, generator=generator)
    logits_q = torch.randn(12, 50, generator=generator)
    logits_p[:, 10:20] = float("-inf")
    logits_q[:, 15:30] = float("-inf")
    np.testing.assert_allclose(
        js_distance(logits_p, logits_q, chunk=5).double().numpy(), scipy_reference(logits_p, logits_q), atol=1e-5
    )


def test_chunking_does_not_change_the_result() -> None:
    generator = torch.Generator().manual_seed(7)
    logits_p = torch.randn(50, 80, generator=generator)
    logits_q = torch.randn(50, 80, generator=generator)
    whole = js_distance(logits_p, logits_q, chunk=50)
    for chunk in (1, 3, 16, 1000):
        assert torch.equal(js_distance(logits_p, logits_q, chunk=chunk), whole)


@pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
def test_invalid_rows_raise_with_the_row_index(bad_value: float) -> None:
    logits_p = torch.zeros(6, 8)
    logits_p[4, 2] = bad_value
    with pytest.raises(ValueError, match=r"token rows \[4\]"):
        js_distance(logits_p, torch.zeros(6, 8), chunk=3)


def test_all_masked_row_raises() -> None:
    logits_q = torch.zeros(3, 8)
    logits_q[1] = float("-inf")
    with pytest.raises(ValueError, match="no valid distribution"):
        js_distance(torch.zeros(3, 8), logits_q)


def test_shape_and_chunk_errors() -> None:
    with pytest.raises(ValueError, match="one shape"):
        js_distance(torch.zeros(3, 8), torch.zeros(3, 9))
    with pytest.raises(ValueError, match="chunk"):
        js_distance(torch.zeros(3, 8), torch.zeros(3, 8), chunk=0)


def test_empty_input_gives_empty_output() -> None:
    assert js_distance(torch.zeros(0, 8), torch.zeros(0, 8)).shape == (0,)

"""js_distance_one_to_many: one full-context block against K leave-one-out blocks, versus K js_distance calls."""

import pytest
import torch

from mrtpo_verl.math.relevance import js_distance, js_distance_one_to_many


def full_and_leave_one_out(k: int, n_tokens: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits_full = torch.randn(n_tokens, vocab, generator=generator) * 3
    # Leave-one-out contexts move the distribution by different amounts, one of them not at all.
    scales = torch.tensor([0.0, 1e-3, 0.1, 2.0, 0.5, 1e-5, 1.0, 0.02])[:k]
    noise = torch.randn(k, n_tokens, vocab, generator=generator)
    return logits_full, logits_full + scales[:, None, None] * noise


@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize(("n_tokens", "vocab", "chunk"), [(13, 50, 4), (5, 300000, 256), (40, 1000, 64)])
def test_equals_k_separate_calls_bit_for_bit(k: int, n_tokens: int, vocab: int, chunk: int) -> None:
    logits_full, logits_loo = full_and_leave_one_out(k, n_tokens, vocab, seed=k + vocab)
    got = js_distance_one_to_many(logits_full, logits_loo, chunk=chunk)
    expected = torch.stack([js_distance(logits_full, logits_loo[i], chunk=chunk) for i in range(k)])
    assert got.shape == (k, n_tokens) and got.dtype == torch.float32
    assert torch.equal(got, expected)
    assert torch.equal(got[0], torch.zeros(n_tokens))  # the unchanged context


def test_bf16_and_masked_entries() -> None:
    logits_full, logits_loo = full_and_leave_one_out(3, 9, 400, seed=1)
    logits_full[:, :50] = float("-inf")
    logits_loo[1, :, 30:80] = float("-inf")
    logits_full, logits_loo = logits_full.bfloat16(), logits_loo.bfloat16()
    expected = torch.stack([js_distance(logits_full, logits_loo[i], chunk=4) for i in range(3)])
    assert torch.equal(js_distance_one_to_many(logits_full, logits_loo, chunk=4), expected)


def test_empty_k_and_empty_rows() -> None:
    assert js_distance_one_to_many(torch.zeros(5, 8), torch.zeros(0, 5, 8)).shape == (0, 5)
    assert js_distance_one_to_many(torch.zeros(0, 8), torch.zeros(3, 0, 8)).shape == (3, 0)


def test_invalid_rows_name_the_context_and_row() -> None:
    logits_loo = torch.zeros(3, 6, 8)
    logits_loo[2, 4, 1] = float("nan")
    with pytest.raises(ValueError, match=r"k=2.*token rows \[4\]"):
        js_distance_one_to_many(torch.zeros(6, 8), logits_loo, chunk=3)


@pytest.mark.parametrize(
    ("full_shape", "loo_shape"), [((6, 8), (2, 6, 9)), ((6, 8), (6, 8)), ((2, 6, 8), (2, 6, 8)), ((6, 8), (2, 5, 8))]
)
def test_shape_errors(full_shape: tuple[int, ...], loo_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="expects"):
        js_distance_one_to_many(torch.zeros(full_shape), torch.zeros(loo_shape))


def test_chunk_error() -> None:
    with pytest.raises(ValueError, match="chunk"):
        js_distance_one_to_many(torch.zeros(6, 8), torch.zeros(2, 6, 8), chunk=0)

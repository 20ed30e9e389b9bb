"""rlhf_core.ops on hand-computed tiny tensors."""

import math

import torch

from rlhf_core.ops import entropy_from_logits, logprobs_from_logits, masked_mean, masked_var, masked_whiten

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # valid: 1, 2, 4 (mean 7/3)


def test_masked_mean_all_and_per_row():
    assert torch.isclose(masked_mean(X, MASK), torch.tensor(7 / 3))
    assert torch.allclose(masked_mean(X, MASK, dim=1), torch.tensor([1.5, 4.0]))
    assert torch.allclose(masked_mean(X, MASK, dim=0), torch.tensor([2.5, 2.0, 0.0]))  # empty column -> 0


def test_masked_values_never_leak():
    noisy = X.masked_fill(MASK == 0, 1e6)
    assert torch.isclose(masked_mean(noisy, MASK), masked_mean(X, MASK))
    assert torch.isclose(masked_var(noisy, MASK), masked_var(X, MASK))


def test_masked_var_biased_and_unbiased():
    # deviations from 7/3: -4/3, -1/3, 5/3 -> squares sum to 42/9
    assert torch.isclose(masked_var(X, MASK, unbiased=False), torch.tensor(42 / 9 / 3))
    assert torch.isclose(masked_var(X, MASK), torch.tensor(42 / 9 / 2))


def test_masked_whiten():
    w = masked_whiten(X, MASK)
    expected = (torch.tensor([1.0, 2.0, 4.0]) - 7 / 3) / math.sqrt(7 / 3)
    assert torch.allclose(w[MASK.bool()], expected, atol=1e-6)
    assert torch.isclose(masked_mean(w, MASK), torch.tensor(0.0), atol=1e-6)
    assert torch.isclose(masked_var(w, MASK), torch.tensor(1.0), atol=1e-6)
    kept = masked_whiten(X, MASK, shift_mean=False)
    assert torch.allclose(kept[MASK.bool()], expected + 7 / 3, atol=1e-6)


def test_logprobs_from_logits():
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # (1, 2, 2): p = [1/4, 3/4], [1/2, 1/2]
    labels = torch.tensor([[1, 0]])
    expected = torch.tensor([[math.log(0.75), math.log(0.5)]])
    assert torch.allclose(logprobs_from_logits(logits, labels), expected)


def test_entropy_from_logits():
    logits = torch.tensor([[[0.0, math.log(3.0)], [2.0, 2.0]]])
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert torch.allclose(entropy_from_logits(logits), torch.tensor([[h, math.log(2.0)]]))
    assert torch.isclose(entropy_from_logits(torch.zeros(1, 1, 384)), torch.tensor(math.log(384))).all()

"""Sampling rules: top-k = 1 is argmax, top-k keeps k, top-p keeps the smallest set with
cumulative probability >= p, temperature divides the logits before the draw, padded ids are
never drawn, a seed reproduces the draw, SamplingParams rejects bad or unsupported values."""

import math

import pytest
import torch

from gigatron.core.inference.sampling import (
    modify_logits_for_top_k_filtering,
    modify_logits_for_top_p_filtering,
    sample,
)
from gigatron.core.inference.sampling_params import SamplingParams


def _logits_from_probs(probs):
    return torch.tensor([[math.log(p) for p in probs]])


def test_top_k_one_is_argmax():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        got = sample(logits, temperature=0.3, top_k=1, generator=gen)
        assert torch.equal(got, logits.argmax(-1))


def test_top_k_filtering_keeps_k_largest():
    logits = torch.tensor([[0.1, 2.0, -1.0, 3.0, 0.5]])
    kept = modify_logits_for_top_k_filtering(logits, 2)
    assert torch.isfinite(kept).tolist() == [[False, True, False, True, False]]
    draws = {
        int(sample(logits, top_k=2, generator=torch.Generator().manual_seed(s))) for s in range(40)
    }
    assert draws == {1, 3}


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.3, {0}),
        (0.55, {0, 1}),
        (0.79, {0, 1}),
        (0.81, {0, 1, 2}),
        (0.96, {0, 1, 2, 3}),
        (1.0, {0, 1, 2, 3}),
    ],
)
def test_top_p_keeps_smallest_set_reaching_p(top_p, kept):
    # probabilities 0.5, 0.3, 0.15, 0.05 placed at shuffled vocabulary positions
    order = [2, 0, 3, 1]  # token id of the i-th most likely entry
    probs = [0.0] * 4
    for rank, p in enumerate([0.5, 0.3, 0.15, 0.05]):
        probs[order[rank]] = p
    out = modify_logits_for_top_p_filtering(_logits_from_probs(probs), top_p)
    got = {order.index(i) for i in range(4) if torch.isfinite(out[0, i])}
    assert got == kept


def test_temperature_scales_logits_before_the_draw():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(1))
    for temperature in (0.5, 2.0):
        got = sample(logits, temperature=temperature, generator=torch.Generator().manual_seed(9))
        ref = torch.multinomial(
            (logits / temperature).softmax(-1), 1, generator=torch.Generator().manual_seed(9)
        ).view(-1)
        assert torch.equal(got, ref)
    # low temperature concentrates on the argmax, high temperature spreads the draws
    big = logits[:1].expand(400, -1)
    cold = sample(big, temperature=0.01, generator=torch.Generator().manual_seed(3))
    hot = sample(big, temperature=100.0, generator=torch.Generator().manual_seed(3))
    assert (cold == logits[0].argmax()).all()
    assert len(set(hot.tolist())) > 10


def test_padded_vocab_never_sampled_and_seed_reproduces():
    logits = torch.zeros(200, 16)
    logits[:, 12:] = 50.0  # padding ids look most likely
    a = sample(logits, vocab_size=12, generator=torch.Generator().manual_seed(4))
    b = sample(logits, vocab_size=12, generator=torch.Generator().manual_seed(4))
    assert int(a.max()) < 12 and torch.equal(a, b)
    assert int(sample(logits, top_k=1, vocab_size=12).max()) < 12


def test_sampling_params_validation():
    assert SamplingParams().num_tokens_to_generate is None  # megatron-core 0.19 (0.16: 30)
    assert SamplingParams(top_k=1).greedy
    for bad in (
        dict(top_k=5, top_p=0.9),
        dict(temperature=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(top_n_logprobs=3),
        dict(stop_words=["x"]),
        dict(num_tokens_to_generate=4, num_tokens_total=9),
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)

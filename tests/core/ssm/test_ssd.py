"""The chunked SSD scan equals the step-by-step recurrence (outputs and final state, with an
initial state, D per head and per channel, sequence lengths that are not a multiple of the chunk),
and the causal convolution's state carries a sequence across calls."""

import pytest
import torch

from gigatron.core.ssm.ssd import causal_conv1d, ssd_chunk_scan, ssd_sequential

Bt, L, HEADS, P, G, N = 2, 11, 4, 3, 2, 5


def _inputs(seed, d_per_channel):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x, B, C = rand(Bt, L, HEADS, P), rand(Bt, L, G, N), rand(Bt, L, G, N)
    dt = torch.rand(Bt, L, HEADS, generator=g, dtype=torch.float64)
    A = -3 * torch.rand(HEADS, generator=g, dtype=torch.float64)
    D = rand(HEADS, P) if d_per_channel else rand(HEADS)
    return x, dt, A, B, C, D, rand(Bt, HEADS, P, N)


@pytest.mark.parametrize("chunk_size", [1, 4, 11, 16])
@pytest.mark.parametrize("d_per_channel", [False, True])
def test_chunked_scan_equals_sequential_recurrence(chunk_size, d_per_channel):
    x, dt, A, B, C, D, s0 = _inputs(chunk_size, d_per_channel)
    y, state = ssd_chunk_scan(x, dt, A, B, C, chunk_size=chunk_size, D=D, initial_state=s0)
    y_ref, state_ref = ssd_sequential(x, dt, A, B, C, D=D, initial_state=s0)
    # fp32 inside: the tolerance is fp32's, not the float64 inputs'
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, state_ref.to(state.dtype), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, ssd_sequential(x, dt, A, B, C, D=D)[0])  # s0 matters


def test_scan_in_two_calls_equals_one():
    x, dt, A, B, C, D, _ = _inputs(7, False)
    y, state = ssd_chunk_scan(x, dt, A, B, C, chunk_size=4, D=D)
    y1, s1 = ssd_chunk_scan(x[:, :6], dt[:, :6], A, B[:, :6], C[:, :6], chunk_size=4, D=D)
    y2, s2 = ssd_chunk_scan(x[:, 6:], dt[:, 6:], A, B[:, 6:], C[:, 6:], chunk_size=4, D=D,
                            initial_state=s1)  # fmt: skip
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s2, state, rtol=1e-5, atol=1e-5)


def test_causal_conv_state_continues_a_sequence():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(2, 6, 9, generator=g), torch.randn(6, 1, 4, generator=g), torch.randn(6)
    full = causal_conv1d(x, w, b)
    ref = torch.nn.functional.silu(
        torch.nn.functional.conv1d(x, w, b, padding=3, groups=6)[..., :9]
    )
    torch.testing.assert_close(full, ref)
    state = torch.zeros(2, 6, 4)
    parts = [causal_conv1d(x[..., i:j], w, b, state) for i, j in [(0, 2), (2, 3), (3, 9)]]
    torch.testing.assert_close(torch.cat(parts, -1), full)
    torch.testing.assert_close(state, x[..., -4:])

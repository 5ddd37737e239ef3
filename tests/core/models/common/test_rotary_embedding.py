"""RotaryEmbedding + apply_rotary_pos_emb: rotary_percent, rotary_base, interleaved layout,
relative-position property, and equality with a direct complex-number formula."""

import types

import pytest
import torch

from gigatron.core.models.common.embeddings import RotaryEmbedding, apply_rotary_pos_emb

S, B, N, HN = 6, 2, 3, 8


def _complex_rope(t, base, rot_dim):
    """Reference: pairs (x_i, x_{i + rot_dim/2}) as complex numbers times e^{i pos theta_i}."""
    half = rot_dim // 2
    theta = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)  # [half]
    angles = torch.arange(t.shape[0], dtype=torch.float64)[:, None] * theta  # [s, half]
    z = torch.complex(t[..., :half].double(), t[..., half:rot_dim].double())
    z = z * torch.polar(torch.ones_like(angles), angles)[:, None, None, :]
    return torch.cat([z.real, z.imag, t[..., rot_dim:].double()], dim=-1).float()


@pytest.mark.parametrize("percent, base", [(1.0, 10000), (0.5, 500)])
def test_matches_complex_rotation(percent, base):
    rope = RotaryEmbedding(HN, rotary_percent=percent, rotary_base=base)
    freqs = rope(S)
    assert freqs.shape == (S, 1, 1, int(HN * percent))
    t = torch.randn(S, B, N, HN)
    got = apply_rotary_pos_emb(t, freqs, config=types.SimpleNamespace(rotary_interleaved=False))
    torch.testing.assert_close(got, _complex_rope(t, base, int(HN * percent)), atol=1e-5, rtol=0)
    if percent < 1:
        torch.testing.assert_close(got[..., HN // 2 :], t[..., HN // 2 :], rtol=0, atol=0)


def test_interleaved_is_the_half_layout_with_channels_permuted():
    t = torch.randn(S, B, N, HN)
    perm = torch.arange(HN).view(2, HN // 2).t().reshape(-1)  # half layout -> interleaved
    half = apply_rotary_pos_emb(
        t, RotaryEmbedding(HN, 1.0)(S), config=types.SimpleNamespace(rotary_interleaved=False)
    )
    inter = apply_rotary_pos_emb(
        t[..., perm],
        RotaryEmbedding(HN, 1.0, rotary_interleaved=True)(S),
        config=types.SimpleNamespace(rotary_interleaved=True),
    )
    torch.testing.assert_close(inter, half[..., perm], atol=1e-6, rtol=0)


def test_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(HN, 1.0)
    cfg = types.SimpleNamespace(rotary_interleaved=False)
    q, k = torch.randn(HN), torch.randn(HN)
    freqs = rope(12)

    def score(i, j):
        qi = apply_rotary_pos_emb(q.expand(12, 1, 1, HN), freqs, config=cfg)[i, 0, 0]
        kj = apply_rotary_pos_emb(k.expand(12, 1, 1, HN), freqs, config=cfg)[j, 0, 0]
        return qi @ kj

    torch.testing.assert_close(score(5, 2), score(9, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(rope(4, offset=3), freqs[3:7])


def test_invalid_rotary_percent():
    with pytest.raises(ValueError, match="rotary_percent"):
        RotaryEmbedding(HN, rotary_percent=0.0)


def test_compiled_rotation_reads_cos_sin_tables_made_once():
    """Under torch.compile the cos/sin tables come from one `gigatron::rope_cos_sin` node (which
    Inductor cannot fuse into the rotation kernels and re-evaluate per head), the compiled rotation
    equals eager bitwise, and angles that require grad still get their gradient (plain ops)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    freqs = RotaryEmbedding(HN, rotary_percent=1.0)(S)
    q, k = torch.randn(S, B, N, HN), torch.randn(S, B, 1, HN)

    def rotate(q, k, freqs):
        return apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)

    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(rotate, backend=counter, fullgraph=True)(q, k, freqs)
    targets = [n.target for g in counter.graphs for n in g.graph.nodes]
    assert sum("rope_cos_sin" in str(t) for t in targets) == 2
    assert not any(t in (torch.cos, torch.sin, "cos", "sin") for t in targets)
    for g, w in zip(got, rotate(q, k, freqs)):
        assert torch.equal(g, w)
    torch._dynamo.reset()
    learned = freqs.clone().requires_grad_(True)
    apply_rotary_pos_emb(q, learned).sum().backward()
    assert learned.grad is not None and learned.grad.abs().sum() > 0

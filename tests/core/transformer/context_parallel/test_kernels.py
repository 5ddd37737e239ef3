"""Process-free pieces of context parallelism: the block kernels with online-softmax merge and
LSE-based backward equal plain attention; the ring's causal block plan covers every causal
(query, key) pair of the zigzag layout exactly once; cp_comm_type resolution and its errors."""

from types import SimpleNamespace

import pytest
import torch

from gigatron.core.transformer.context_parallel import _kernels, _layout
from gigatron.core.transformer.context_parallel.context_parallel_attention import (
    resolve_cp_comm_type,
)
from gigatron.core.transformer.context_parallel.ring_attention import _block_plan

B, NG, G, S, HN = 2, 2, 3, 8, 4


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, NG, G, S, HN, generator=g)
    k = torch.randn(B, NG, S, HN, generator=g)
    v = torch.randn(B, NG, S, HN, generator=g)
    return q, k, v


@pytest.fixture(params=["plain", "fused"])
def path(request, monkeypatch):
    """Run the block kernels on the plain path and through PyTorch's CPU flash kernel."""
    monkeypatch.setattr(_kernels, "FUSED_ON_CPU", request.param == "fused")
    return request.param


def _plain(q, k, v, scale, causal):
    """Reference with K/V repeated per query head (how DotProductAttention does GQA)."""
    kr, vr = k.unsqueeze(2).expand(q.shape), v.unsqueeze(2).expand(q.shape)
    s = q @ kr.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(_kernels.causal_mask(S), float("-inf"))
    return torch.softmax(s, -1) @ vr


@pytest.mark.parametrize("causal", [True, False])
def test_blocks_merged_online_equal_full_softmax(causal, path):
    q, k, v = _qkv()
    ref = _plain(q, k, v, 0.7, causal)
    out = torch.zeros(q.shape, dtype=torch.float32)
    lse = torch.full(q.shape[:-1], float("-inf"))
    # keys in two halves: diagonal block causal, the earlier half full for the later queries
    h = S // 2
    for rows, cols, diag in (
        (slice(0, h), slice(0, h), causal),
        (slice(h, S), slice(h, S), causal),
        (slice(h, S), slice(0, h), False),
    ):
        o, l_, _ = _kernels.block_forward(
            q[..., rows, :], k[..., cols, :], v[..., cols, :], 0.7, diag
        )
        _kernels.merge(out, lse, o, l_, rows)
    if not causal:
        o, l_, _ = _kernels.block_forward(q[..., :h, :], k[..., h:, :], v[..., h:, :], 0.7, False)
        _kernels.merge(out, lse, o, l_, slice(0, h))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_block_backward_with_final_lse_equals_autograd(path):
    q, k, v = (t.requires_grad_() for t in _qkv(1))
    ref = _plain(q, k, v, 0.5, True)
    dout = torch.randn(ref.shape)
    ref.backward(dout)
    out, lse, _ = _kernels.block_forward(q.detach(), k.detach(), v.detach(), 0.5, True)
    delta = (dout * out).sum(-1)
    h = S // 2
    dq = torch.zeros(q.shape)
    dk, dv = torch.zeros(k.shape), torch.zeros(v.shape)
    for rows, cols, diag in (
        (slice(0, h), slice(0, h), True),
        (slice(h, S), slice(h, S), True),
        (slice(h, S), slice(0, h), False),
    ):
        a, b, c = _kernels.block_backward(
            dout[..., rows, :],
            out[..., rows, :],
            delta[..., rows],
            q.detach()[..., rows, :],
            k.detach()[..., cols, :],
            v.detach()[..., cols, :],
            lse[..., rows],
            0.5,
            diag,
        )
        dq[..., rows, :] += a
        dk[..., cols, :] += b
        dv[..., cols, :] += c
    for mine, ref_grad in ((dq, q.grad), (dk, k.grad), (dv, v.grad)):
        torch.testing.assert_close(mine, ref_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_ring_plan_covers_causal_pairs_exactly_once(cp):
    local = 4  # two chunks of 2
    for rank in range(cp):
        q_pos = _layout.zigzag_positions(cp, rank, local)
        count = torch.zeros(local, cp * 2 * (local // 2), dtype=torch.int)
        for step in range(cp):
            src = (rank - step) % cp
            k_pos = _layout.zigzag_positions(cp, src, local)
            rows, cols, diag = _block_plan(step, rank, cp, True, local)
            qr, kc = q_pos[rows], k_pos[cols]
            seen = torch.ones(len(qr), len(kc), dtype=torch.bool)
            if diag:
                seen = ~_kernels.causal_mask(len(qr))
            for i, qp in enumerate(qr.tolist()):
                for j, kp in enumerate(kc.tolist()):
                    count[q_pos.tolist().index(qp), kp] += int(seen[i, j])
        causal = (torch.arange(count.shape[1])[None, :] <= q_pos[:, None]).int()
        assert torch.equal(count, causal), (cp, rank)


def test_zigzag_positions_partition_the_sequence():
    for cp in (1, 2, 4):
        pos = _layout.gathered_positions(cp, 4)
        assert sorted(pos.tolist()) == list(range(4 * cp))
    assert _layout.zigzag_positions(2, 0, 4).tolist() == [0, 1, 6, 7]
    assert _layout.zigzag_positions(2, 1, 4).tolist() == [2, 3, 4, 5]


def test_resolve_cp_comm_type():
    cfg = SimpleNamespace(cp_comm_type=None, num_layers=2)
    assert resolve_cp_comm_type(None, cfg, 1) == "p2p"  # Megatron's default
    assert resolve_cp_comm_type("a2a", cfg, 1) == "a2a"
    cfg.cp_comm_type = ["all_gather", "a2a"]
    assert resolve_cp_comm_type(None, cfg, 2) == "a2a"
    with pytest.raises(ValueError, match="a2a\\+p2p"):
        resolve_cp_comm_type("a2a+p2p", cfg, 1)
    with pytest.raises(ValueError, match="must be one of"):
        resolve_cp_comm_type("ring", cfg, 1)
    cfg.cp_comm_type = ["p2p"]
    with pytest.raises(ValueError, match="one per layer"):
        resolve_cp_comm_type(None, cfg, 1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_flash_blocks_match_plain_path():
    """The CUDA flash adapter (bf16) against the plain fp32 math on the same bf16 inputs."""
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(1, 2, 2, 128, 64, device="cuda", generator=g).bfloat16()
    k = torch.randn(1, 2, 128, 64, device="cuda", generator=g).bfloat16()
    v = torch.randn(1, 2, 128, 64, device="cuda", generator=g).bfloat16()
    out, lse, meta = _kernels.block_forward(q, k, v, 0.125, True)
    assert meta is not None  # the fused path ran
    ref_out, ref_lse, _ = _kernels.block_forward(q.float(), k.float(), v.float(), 0.125, True)
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, ref_lse, atol=2e-2, rtol=2e-2)
    dout = torch.randn(out.shape, device="cuda", generator=g)
    delta = (dout * out).sum(-1)
    fused = _kernels.block_backward(dout, out, delta, q, k, v, lse, 0.125, True, meta)
    plain = _kernels.block_backward(
        dout, out, delta, q.float(), k.float(), v.float(), lse, 0.125, True
    )
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_get_cp_core_attention_swaps_only_dot_product_attention():
    from gigatron.core.transformer.context_parallel import (
        ContextParallelAttention,
        get_cp_core_attention,
    )
    from gigatron.core.transformer.dot_product_attention import DotProductAttention
    from gigatron.core.transformer.sdpa_attention import SDPADotProductAttention
    from gigatron.core.transformer.spec_utils import ModuleSpec

    cp2, cp1 = SimpleNamespace(context_parallel_size=2), SimpleNamespace(context_parallel_size=1)
    assert get_cp_core_attention(DotProductAttention, cp2) is ContextParallelAttention
    assert get_cp_core_attention(SDPADotProductAttention, cp2) is ContextParallelAttention
    assert get_cp_core_attention(ModuleSpec(DotProductAttention), cp2) is ContextParallelAttention
    assert get_cp_core_attention(DotProductAttention, cp1) is DotProductAttention
    assert get_cp_core_attention(torch.nn.Identity, cp2) is torch.nn.Identity


def test_attention_causal_is_aligned_bottom_right():
    """Queries that are the last rows of the sequence see every key up to their own position."""
    q, k, v = _qkv(3)
    h = S // 2
    out = _kernels.attention(q[..., h:, :], k, v, 0.6, True)
    torch.testing.assert_close(out, _plain(q, k, v, 0.6, True)[..., h:, :], atol=1e-5, rtol=1e-5)
    full = _kernels.attention(q, k, v, 0.6, False)
    torch.testing.assert_close(full, _plain(q, k, v, 0.6, False), atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_attention_matches_plain_path():
    """SDPA with the lower-right causal bias (bf16, GQA) against the plain fp32 math."""
    g = torch.Generator(device="cuda").manual_seed(4)
    q = torch.randn(1, 2, 2, 64, 64, device="cuda", generator=g).bfloat16()
    k = torch.randn(1, 2, 192, 64, device="cuda", generator=g).bfloat16()
    v = torch.randn(1, 2, 192, 64, device="cuda", generator=g).bfloat16()
    for causal in (True, False):
        out = _kernels.attention(q, k, v, 0.125, causal).float().cpu()
        ref = _kernels.attention(*(t.float().cpu() for t in (q, k, v)), 0.125, causal)
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)

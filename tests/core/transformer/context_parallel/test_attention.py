"""ContextParallelAttention on CP = 2 and 4 gloo ranks, each cp_comm_type, causal and full, GQA:
output, dQ, dK and dV of this rank's zigzag tokens equal DotProductAttention on the whole
sequence (fp32, 1e-5)."""

import pytest
import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.transformer.context_parallel import ContextParallelAttention
from gigatron.core.transformer.context_parallel._layout import zigzag_positions
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnMaskType
from gigatron.core.transformer.transformer_config import TransformerConfig
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


S, B, NP, HN = 16, 2, 4, 8


def _config(cp, ng):
    return TransformerConfig(
        num_layers=1,
        hidden_size=NP * HN,
        num_attention_heads=NP,
        num_query_groups=ng,
        context_parallel_size=cp,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )


def _parity(cp, comm, causal, ng):
    ps.initialize_model_parallel(context_parallel_size=cp)
    torch.manual_seed(0)
    q = torch.randn(S, B, NP, HN, requires_grad=True)
    k = torch.randn(S, B, ng, HN, requires_grad=True)
    v = torch.randn(S, B, ng, HN, requires_grad=True)
    dout = torch.randn(S, B, NP * HN)
    mask_type = AttnMaskType.causal if causal else AttnMaskType.no_mask
    ref = DotProductAttention(_config(1, ng), 1, mask_type)
    out = ref(q, k, v, None)
    out.backward(dout)

    idx = zigzag_positions(cp, ps.get_context_parallel_rank(), S // cp)
    q_l, k_l, v_l = (t.detach()[idx].requires_grad_() for t in (q, k, v))
    attn = ContextParallelAttention(_config(cp, ng), 1, mask_type, cp_comm_type=comm)
    out_l = attn(q_l, k_l, v_l, None)
    out_l.backward(dout[idx])
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_l, out.detach()[idx], **tol)
    torch.testing.assert_close(q_l.grad, q.grad[idx], **tol)
    torch.testing.assert_close(k_l.grad, k.grad[idx], **tol)
    torch.testing.assert_close(v_l.grad, v.grad[idx], **tol)
    return (out_l - out.detach()[idx]).abs().max().item()


def _all_cases(cp):
    worst = 0.0
    for comm in ("p2p", "all_gather", "a2a"):
        for causal in (True, False):
            for ng in (NP, 2):  # MHA and GQA (2 K/V heads: not divisible by cp = 4 for a2a)
                worst = max(worst, _parity(cp, comm, causal, ng))
                ps.destroy_model_parallel()
    dist.barrier()
    return worst


def _fused_ring_cases(cp):
    """The ring through the fused-kernel adapter (CPU flash kernel standing in for CUDA's)."""
    from gigatron.core.transformer.context_parallel import _kernels

    _kernels.FUSED_ON_CPU = True
    worst = 0.0
    for causal in (True, False):
        worst = max(worst, _parity(cp, "p2p", causal, 2))
        ps.destroy_model_parallel()
    return worst


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_ring_fused_kernels_match_full_sequence(cp):
    assert max(run_distributed(_fused_ring_cases, cp, args=(cp,))) <= 1e-5


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_attention_matches_full_sequence(cp):
    errors = run_distributed(_all_cases, cp, args=(cp,), timeout=240)
    assert max(errors) <= 1e-5


def _a2a_heads_error():
    ps.initialize_model_parallel(context_parallel_size=4)
    cfg = TransformerConfig(
        num_layers=1,
        hidden_size=24,
        num_attention_heads=6,
        context_parallel_size=4,
        attention_dropout=0.0,
    )
    attn = ContextParallelAttention(cfg, 1, AttnMaskType.causal, cp_comm_type="a2a")
    x = torch.randn(4, 1, 6, 4)
    with pytest.raises(ValueError, match="divisible by context_parallel_size"):
        attn(x, x, x, None)
    with pytest.raises(ValueError, match="must be even"):
        attn(x[:3], x[:3], x[:3], None)


def test_a2a_needs_heads_divisible_by_cp_and_even_local_sequence():
    run_distributed(_a2a_heads_error, 4)

"""Sliding windows and attention sinks under context parallelism on CP = 2 gloo ranks: for
cp_comm_type 'all_gather' and 'a2a', MHA and GQA, this rank's zigzag outputs and dQ / dK / dV, and
the learnable sinks' gradient summed over CP ranks (as the dp-cp gradient reduction sums it),
equal DotProductAttention on the whole sequence (fp32, 1e-5); 'p2p' refuses them in one line."""

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
VARIANTS = (((3, 0), "vanilla"), (None, "learnable"), ((5, 0), "off-by-one"), ((2, 0), "learnable"))


def _config(cp, ng, window, softmax_type):
    return TransformerConfig(
        num_layers=1, hidden_size=NP * HN, num_attention_heads=NP, num_query_groups=ng,
        context_parallel_size=cp, attention_dropout=0.0, hidden_dropout=0.0,
        window_size=window, softmax_type=softmax_type,
    )  # fmt: skip


def _parity(cp, comm, ng, window, softmax_type):
    torch.manual_seed(0)
    q = torch.randn(S, B, NP, HN, requires_grad=True)
    k = torch.randn(S, B, ng, HN, requires_grad=True)
    v = torch.randn(S, B, ng, HN, requires_grad=True)
    dout = torch.randn(S, B, NP * HN)
    ref = DotProductAttention(_config(1, ng, window, softmax_type), 1, AttnMaskType.causal)
    if softmax_type == "learnable":
        with torch.no_grad():
            ref.softmax_offset.copy_(torch.randn(NP))
    ref(q, k, v, None).backward(dout)
    out_ref = ref(q, k, v, None).detach()

    idx = zigzag_positions(cp, ps.get_context_parallel_rank(), S // cp)
    q_l, k_l, v_l = (t.detach()[idx].requires_grad_() for t in (q, k, v))
    attn = ContextParallelAttention(
        _config(cp, ng, window, softmax_type), 1, AttnMaskType.causal, cp_comm_type=comm
    )
    attn.load_state_dict(ref.state_dict())
    out = attn(q_l, k_l, v_l, None)
    out.backward(dout[idx])
    tol = dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, out_ref[idx], **tol)
    for got, want in ((q_l, q), (k_l, k), (v_l, v)):
        torch.testing.assert_close(got.grad, want.grad[idx], **tol)
    if softmax_type == "learnable":
        grad = attn.softmax_offset.grad.clone()
        dist.all_reduce(grad, group=ps.get_context_parallel_group())
        torch.testing.assert_close(grad, ref.softmax_offset.grad, **tol)
    return (out - out_ref[idx]).abs().max().item()


def _cases(cp):
    ps.initialize_model_parallel(context_parallel_size=cp)
    worst = 0.0
    for comm in ("all_gather", "a2a"):
        for ng in (NP, 2):
            for window, softmax_type in VARIANTS:
                worst = max(worst, _parity(cp, comm, ng, window, softmax_type))
    with pytest.raises(ValueError, match="needs cp_comm_type 'all_gather' or 'a2a'"):
        ContextParallelAttention(_config(cp, NP, (3, 0), "vanilla"), 1, AttnMaskType.causal,
                                 cp_comm_type="p2p")  # fmt: skip
    return worst


def test_cp_window_and_sinks_match_full_sequence():
    assert max(run_distributed(_cases, 2, args=(2,), timeout=240)) <= 1e-5

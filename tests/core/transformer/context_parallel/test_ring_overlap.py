"""The ring overlaps communication with compute: at every step the K/V transfer for the next
block is posted before this block's attention runs and waited for only afterwards; in backward
the dK/dV accumulator of a block is waited for only after the next local block is computed.
Checked by recording the order of the ring's calls (CP = 2 and 4), with the result still exact."""

import importlib

import pytest
import torch

from gigatron.core import parallel_state as ps
from gigatron.testing import run_distributed

pytestmark = pytest.mark.multirank


class _Tagged(list):
    kind = ""


def _trace(cp):
    from gigatron.core.transformer.context_parallel import _kernels

    # the package re-exports the function under the module's name: fetch the module itself
    ra = importlib.import_module("gigatron.core.transformer.context_parallel.ring_attention")

    ps.initialize_model_parallel(context_parallel_size=cp)
    log = []
    send_recv, wait = ra._RingComm.send_recv, ra._RingComm.wait
    block_fwd, block_bwd = _kernels.block_forward, _kernels.block_backward

    def traced_send_recv(self, tensor, tag=ra._KV_TAG):
        kind = "kv" if tag == ra._KV_TAG else "dkv"
        log.append(f"post {kind}")
        buf, reqs = send_recv(self, tensor, tag)
        reqs = _Tagged(reqs)
        reqs.kind = kind
        return buf, reqs

    def traced_wait(reqs):
        log.append(f"wait {reqs.kind}")
        wait(reqs)

    def traced_fwd(*a):
        log.append("attn")
        return block_fwd(*a)

    def traced_bwd(*a):
        log.append("attn bwd")
        return block_bwd(*a)

    ra._RingComm.send_recv = traced_send_recv
    ra._RingComm.wait = staticmethod(traced_wait)
    _kernels.block_forward, _kernels.block_backward = traced_fwd, traced_bwd

    torch.manual_seed(0)
    s = 4
    q = torch.randn(s, 1, 2, 4, requires_grad=True)
    k = torch.randn(s, 1, 2, 4, requires_grad=True)
    group = ps.get_context_parallel_group()
    out = ra.ring_attention(
        q, k, k, scale=0.5, causal=True, group=group, global_ranks=list(range(cp))
    )
    forward_log = list(log)
    log.clear()
    out.sum().backward()
    return forward_log, list(log)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_posts_next_transfer_before_compute(cp):
    forward_log, backward_log = run_distributed(_trace, cp, args=(cp,))[0]
    # forward: post K/V(i+1) -> attention(i) -> wait K/V(i+1); the last block needs no transfer
    assert forward_log == ["post kv", "attn", "wait kv"] * (cp - 1) + ["attn"]
    # backward: K/V as in forward; the dK/dV accumulator received at step i-1 is waited for only
    # after attention backward of step i; one last hop brings each rank its own dK/dV
    expected = ["post kv", "attn bwd", "post dkv", "wait kv"]
    for _ in range(cp - 2):
        expected += ["post kv", "attn bwd", "wait dkv", "post dkv", "wait kv"]
    expected += ["attn bwd", "wait dkv", "post dkv", "wait dkv"]
    assert backward_log == expected

"""MultiTensorAdamW's Triton step on two CUDA streams.

Step 1 runs on stream A (the address arrays are built there), steps 2 and 3 on stream B, which first
sleeps ~1 s so its kernels wait; step 2 keeps step 1's grad tensors (new values copied in: no
address moves), step 3 brings new grad tensors (the arrays are rebuilt). Meanwhile stream A
allocates thousands of small int64 tensors and fills them with the addresses of a decoy set of
tensors. Had step 2 reused the arrays built on A (the old cache), step 3 would have freed them into
A's pool while B's step-2 kernel had not read them yet: A's decoy fill would take that memory and
the kernel would update the decoys, not the params. The params must equal torch.optim.AdamW's after
the same three steps."""

import importlib.util

import pytest
import torch

from bench.optimizer.multi_tensor_adamw import MultiTensorAdamW

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton"),
]

SHAPES = [(33, 7), (5000,), (4, 3, 2), (1,), (300, 20)]


def _tensors(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(s, generator=g) * 0.1).cuda() for s in SHAPES]


def test_steps_on_two_streams_match_torch_adamw():
    stream_a, stream_b = torch.cuda.current_stream(), torch.cuda.Stream()
    ps = [torch.nn.Parameter(t) for t in _tensors(0)]
    ref = [torch.nn.Parameter(p.detach().clone()) for p in ps]
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    opt, ref_opt = MultiTensorAdamW(ps, **kw), torch.optim.AdamW(ref, foreach=False, **kw)
    # every grad made now (a host -> device copy on B would wait for its sleep): steps 1 and 2
    # step `live` (step 2's values copied in on B), step 3 steps vals[2]: new addresses
    vals = [_tensors(1), _tensors(2), _tensors(3)]
    live = [v.clone() for v in vals[0]]
    # decoys: where a stale address array would point the kernel
    decoys = [_tensors(4) for _ in range(4)]  # params, grads, exp_avg, exp_avg_sq
    decoy_addrs = torch.tensor([[t.data_ptr() for t in d] for d in decoys]).view(-1).cuda()

    for p, g in zip(ps, live, strict=True):
        p.grad = g
    opt.step()  # stream A
    assert opt._tables and list(opt._addresses.values())[0][3] == stream_a
    stream_b.wait_stream(stream_a)  # B's steps follow step 1 (the caller's job)
    with torch.cuda.stream(stream_b):
        torch.cuda._sleep(2_000_000_000)  # ~1 s: steps 2 and 3 wait on B
        for g, v in zip(live, vals[1], strict=True):
            g.copy_(v)
        opt.step()  # step 2: the same addresses as step 1, now on B
        assert list(opt._addresses.values())[0][3] == stream_b
        for p, g in zip(ps, vals[2], strict=True):
            p.grad = g
        opt.step()  # step 3: new addresses (step 2's arrays dropped)
        assert list(opt._addresses.values())[0][3] == stream_b
    fills = []
    for _ in range(8192):  # two 2 MiB small-block segments' worth of 512-byte blocks on A
        fills.append(torch.empty_like(decoy_addrs).copy_(decoy_addrs))
    torch.cuda.synchronize()

    for grads_k in vals:
        for p, g in zip(ref, grads_k, strict=True):
            p.grad = g
        ref_opt.step()
    for a, b in zip(ps, ref, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)
    assert max((a - t).abs().max().item() for a, t in zip(ps, _tensors(0), strict=True)) > 1e-2

"""MultiTensorAdamW's device caches and CUDA streams, host logic on CPU (the kernel replaced by
one that records its arguments, the current stream by a settable stand-in): the address arrays
are reused only on the stream that copied them and copied anew when a step runs on another
stream (their non-blocking copy is ordered on that stream alone); a block table read on a stream
other than its own is recorded on that stream for the caching allocator.
test_multi_tensor_adamw_streams_cuda.py runs two real streams."""

import sys
import types

import torch

from bench.optimizer import multi_tensor_adamw as mod
from bench.optimizer.multi_tensor_adamw import MultiTensorAdamW


def test_address_arrays_follow_the_current_stream(monkeypatch):
    launches, kept = [], []
    fake = types.ModuleType("bench.optimizer._triton_adamw")
    fake.launch = lambda tables, addrs, *rest: launches.append((tables, addrs))
    monkeypatch.setitem(sys.modules, "bench.optimizer._triton_adamw", fake)
    import bench.optimizer as pkg

    monkeypatch.setattr(pkg, "_triton_adamw", fake, raising=False)
    current = ["stream A"]
    monkeypatch.setattr(mod, "_current_stream", lambda device: current[0], raising=False)
    monkeypatch.setattr(
        mod, "_keep_alive_on", lambda ts, stream: kept.append((ts, stream)), raising=False
    )
    ps = [torch.nn.Parameter(torch.zeros(n)) for n in (300, 5000, 7)]
    opt = MultiTensorAdamW(ps, lr=1e-3, block=128, use_triton=True)
    for p in ps:
        p.grad = torch.ones_like(p)  # the same grad tensors every step: no address moves

    for stream in ("stream A", "stream A", "stream B", "stream B", "stream A"):
        current[0] = stream
        opt.step()
    addrs = [a for _, a in launches]
    assert addrs[1] is addrs[0]  # same stream, same addresses: reused
    assert addrs[2] is not addrs[1]  # another stream: copied anew there
    assert addrs[3] is addrs[2]
    assert addrs[4] is not addrs[3]
    want = [p.data_ptr() for p in ps] + [p.grad.data_ptr() for p in ps]
    for a in addrs:
        assert a[0].tolist() + a[1].tolist() == want
    ((_, _, _, built_on),) = opt._addresses.values()
    assert built_on == "stream A"

    # one block table throughout (same sizes), allocated on stream A: recorded on stream B
    # each time B reads it, never on A
    assert all(t is launches[0][0] for t, _ in launches)
    assert [stream for _, stream in kept] == ["stream B", "stream B"]
    assert all(ts is launches[0][0] for ts, _ in kept)


def test_off_cuda_there_is_no_stream():
    assert mod._current_stream(torch.device("cpu")) is None
    t = torch.zeros(3)
    mod._keep_alive_on((t,), None)  # nothing to record off CUDA

"""bench_gpt's eager step on CPU under the estimator's `LiveTensorBytes`, against the estimate.

    python bench/estimate/estimate_memory_cpu.py --config gpt-125m --fused-ce  # ~2 min, ~9 GB RAM
    python bench/estimate/estimate_memory_cpu.py --config gpt-125m --mbs 4 --layers 2

The model bench_gpt builds (`build_model`, its eager `--compile none --no-input-checks` path: fast
spec, chunked cross entropy, tied embeddings) in bf16 as on the GPU, torch's fused AdamW on the
bf16 parameters, grads set to None between steps; every live tensor storage counted from the
model's construction on. Prints the bytes alive at the end of forward (activations), the peak of
the last step and the largest tensors alive there, then `RESULT {json}` with `gigatron estimate`'s
numbers for the same shape (bench/estimate/estimate_check.py's precision).

`--fused-ce`: the chunked cross entropy's three elementwise helpers count only their outputs, as
the fused kernels they are compiled into on CUDA allocate; eager on CPU they make fp32 [c, V]
temporaries (three fp32 [4096, 50304] and a bool one alive at once: +2.5 GiB at gpt-125m)
that a GPU run never has.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from gigatron.tools.estimate.measure import LiveTensorBytes  # noqa: E402


class _Labelled(LiveTensorBytes):
    """LiveTensorBytes that also remembers each live storage's op and shape, and the live set
    at the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.info: dict[int, tuple] = {}
        self.at_peak: dict[int, tuple] = {}

    def _release(self, key: int, nbytes: int) -> None:
        self.info.pop(key, None)
        super()._release(key, nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        peak = self.peak
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                key = t.untyped_storage()._cdata
                if key in self._refs and key not in self.info:
                    self.info[key] = (t.untyped_storage().nbytes(), str(func), tuple(t.shape))
        if self.peak > peak:
            self.at_peak = dict(self.info)
        return out


def _largest(info: dict, top: int = 12) -> list[str]:
    agg = collections.defaultdict(lambda: [0, 0])
    for nbytes, func, shape in info.values():
        agg[(func, shape)][0] += nbytes
        agg[(func, shape)][1] += 1
    rows = sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]
    return [f"{b / 2**20:9.1f} MiB x{n:<3} {f} {s}" for (f, s), (b, n) in rows]


def _fused_helpers(ce) -> None:

    def fused(fn):
        def run(*args):
            with _disable_current_modes():  # the kernel's registers: not counted
                out = fn(*args)
            return out.clone()  # its output, counted once

        return run

    ce._HELPERS["eager"] = tuple(fused(f) for f in ce._HELPERS["eager"])


def _estimate(config: str, mbs: int, layers: int) -> dict:
    from bench.estimate.estimate_check import train_flags
    from gigatron.tools.estimate.args import estimate_args
    from gigatron.tools.estimate.memory import Precision
    from gigatron.tools.estimate.report import estimate_rank

    flags = train_flags(config)
    flags[flags.index("--micro-batch-size") + 1] = str(mbs)
    flags[flags.index("--num-layers") + 1] = str(layers)
    args = estimate_args([*flags, "--world-size", "1"])
    r = estimate_rank(args, 0, precision=Precision(param=2, grad=0, master=0, moment=2))
    return {k: r[k] / 2**30 for k in r if k.endswith("_bytes")}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default="gpt-125m")
    p.add_argument("--mbs", type=int, default=None, help="default: the config's")
    p.add_argument("--layers", type=int, default=None, help="default: the config's")
    p.add_argument("--fused-ce", action="store_true", help="CE helpers as fused kernels (CUDA)")
    p.add_argument("--steps", type=int, default=2, help="the peak is the last step's")
    a = p.parse_args(argv)
    from bench._lib.args import parse_args as bench_args
    from bench.gpt import bench_gpt
    from gigatron.core import parallel_state
    from gigatron.core.fusions import chunked_cross_entropy as ce
    from gigatron.core.models.common.embeddings import language_model_embedding

    ba = bench_args(["--config", a.config, "--compile", "none", "--no-input-checks"])
    ba.device, ba.init = "cpu", "device"
    shape = dict(bench_gpt.CONFIGS[a.config])
    shape["mbs"], shape["layers"] = a.mbs or shape["mbs"], a.layers or shape["layers"]
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29611", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    language_model_embedding.CHECK_INPUT_IDS = False
    eager_helpers = ce._HELPERS["eager"]
    if a.fused_ce:
        _fused_helpers(ce)
    bench_gpt._seed(ba)
    b, s, v = shape["mbs"], shape["seq"], shape["vocab"]
    g = torch.Generator().manual_seed(1234)
    tokens, labels = (torch.randint(0, v, (b, s), generator=g) for _ in range(2))
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    with _Labelled() as mem:
        model, _ = bench_gpt.build_model(shape, ba)  # fp32 on CPU: cast as CUDA's build does
        model = model.to(torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        for _ in range(a.steps):
            opt.zero_grad(set_to_none=True)
            mem.reset_peak()
            start = mem.live
            loss = bench_gpt.gpt_loss(model, tokens, pos, labels)
            activations = mem.live - start
            loss.backward()
            opt.step()
    ce._HELPERS["eager"] = eager_helpers  # the estimate's trace swaps them itself
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    print("largest tensors alive at the peak:", *_largest(mem.at_peak), sep="\n  ")
    est = _estimate(a.config, shape["mbs"], shape["layers"])
    out = {
        "config": a.config,
        "mbs": shape["mbs"],
        "layers": shape["layers"],
        "fused_ce": a.fused_ce,
        "measured_activation_gib": round(activations / 2**30, 4),
        "measured_peak_gib": round(mem.peak / 2**30, 4),
        "estimated_activation_gib": round(est["activation_bytes"], 4),
        "estimated_peak_gib": round(est["peak_bytes"], 4),
        "ratio": round(est["peak_bytes"] * 2**30 / mem.peak, 3),
    }
    print("RESULT", json.dumps(out))


if __name__ == "__main__":
    main()

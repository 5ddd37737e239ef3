"""The layer GEMMs of one GPT training step, timed in isolation, for two initial-value
distributions (one GPU, bf16).

    python bench/gpt/bench_gemm_shapes.py [--config gpt-1.3b]

Session 6's profiles show every cuBLAS kernel class of gigatron's gpt-1.3b step running 4-6%
longer than the same kernel on the same shapes in the plain-PyTorch anchor's step. This times
each layer GEMM (qkv, proj, fc1, fc2; forward, input-gradient and weight-gradient) on its own
with weights drawn as Megatron initialises them (N(0, 0.02), proj / fc2 N(0, 0.02 / sqrt(2L)))
and as the anchor's PyTorch defaults do (U(+-1/sqrt(fan_in))), inputs N(0, 1) (LayerNorm
outputs) and output gradients N(0, 1e-3). If the two distributions time differently, the gap is
data-dependent (power / clocks), not gigatron's kernels. CUDA events, mean of 30 after 5
warm-up; the per-step sums multiply by the layer count. Prints one `RESULT {json}` line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench._lib.args import CONFIGS  # noqa: E402
from bench._lib.timing import cuda_ms  # noqa: E402

# GPT-shaped configs only: the shapes below assume multi-head qkv [3h, h], a 4h GELU MLP with
# biases, LayerNorm and learned positions (llama-1b's GQA / SwiGLU / RMSNorm shapes would be wrong)
GPT_CONFIGS = sorted(
    k
    for k, c in CONFIGS.items()
    if not {"kv_heads", "ffn", "swiglu", "rope", "rmsnorm", "bias"} & set(c)
)


def timed(fn) -> float:
    return cuda_ms(fn, iters=30)


def weight(out_f: int, in_f: int, init: str, scaled: bool, layers: int) -> torch.Tensor:
    if init == "anchor":
        bound = in_f**-0.5
        return torch.empty(out_f, in_f, device="cuda").uniform_(-bound, bound).bfloat16()
    std = 0.02 / (2 * layers) ** 0.5 if scaled else 0.02
    return (torch.randn(out_f, in_f, device="cuda") * std).bfloat16()


def linear_ms(n: int, in_f: int, out_f: int, init: str, scaled: bool, layers: int) -> dict:
    """fwd x W^T + b, dgrad dy W, wgrad dy^T x for x [n, in_f], W [out_f, in_f]."""
    w = weight(out_f, in_f, init, scaled, layers)
    b = torch.zeros(out_f, device="cuda", dtype=torch.bfloat16)
    if init == "anchor":
        b.uniform_(-(in_f**-0.5), in_f**-0.5)
    x = torch.randn(n, in_f, device="cuda").bfloat16()
    dy = (torch.randn(n, out_f, device="cuda") * 1e-3).bfloat16()
    return {
        "fwd": timed(lambda: torch.addmm(b, x, w.t())),
        "dgrad": timed(lambda: torch.mm(dy, w)),
        "wgrad": timed(lambda: torch.mm(dy.t(), x)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt-1.3b", choices=GPT_CONFIGS)
    a = ap.parse_args(argv)
    cfg = CONFIGS[a.config]
    h, layers, n = cfg["hidden"], cfg["layers"], cfg["mbs"] * cfg["seq"]
    shapes = {  # name: (in, out, Megatron's scaled output init)
        "qkv": (h, 3 * h, False),
        "proj": (h, h, True),
        "fc1": (h, 4 * h, False),
        "fc2": (4 * h, h, True),
    }
    out = {"config": a.config, "tokens": n}
    for init in ("megatron", "anchor"):
        per = {k: linear_ms(n, i, o, init, s, layers) for k, (i, o, s) in shapes.items()}
        out[init] = {k: {p: round(t, 4) for p, t in v.items()} for k, v in per.items()}
        out[f"{init}_step_ms"] = round(layers * sum(sum(v.values()) for v in per.values()), 2)
    out["gpu"] = torch.cuda.get_device_name()
    out["torch"] = torch.__version__
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()

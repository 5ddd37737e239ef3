"""Kernel profile of the plain-PyTorch anchor (bench/anchors/torch_baseline_bench.py), in the
same categories as `bench_gpt.py --profile`, so the two can be compared kernel class by class.

    python bench/gpt/compare_profile.py gpt-1.3b compile OUT.json
    python bench/gpt/compare_profile.py moe compile OUT.json    # torch_moe_bench.py (fwd + bwd)

The anchor file is used unmodified: its model classes are executed from its source (everything
before its command-line part), then timed (5 warm-up, mean of 10) and profiled (3 steps).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

ANCHORS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "anchors")
# the repo root: gigatron and bench.* import without an install
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ANCHORS)  # gpt_flops, as the anchors import it

from bench._lib.profiling import profile_step  # noqa: E402


def _anchor_namespace(
    file: str = "torch_baseline_bench.py", cut: str = "name, compile_ = sys.argv"
):
    path = os.path.join(ANCHORS, file)
    with open(path) as f:
        src = f.read()
    src = src[: src.index(cut)]  # classes and imports only
    ns: dict = {"__name__": "anchor", "__file__": path}
    exec(compile(src, path, "exec"), ns)
    return ns


def _time(step, warmup: int, n: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def main_moe(mode: str, out: str) -> None:
    """The MoE anchor's step as it times it: forward + backward of one micro-batch."""
    ns = _anchor_namespace("torch_moe_bench.py", "compile_ = len(sys.argv)")
    torch.manual_seed(0)
    model = ns["GPT"]().cuda().to(torch.bfloat16)
    fwd = torch.compile(model) if mode == "compile" else model
    ids = torch.randint(0, ns["V"], (ns["B"], ns["S"]), device="cuda")

    def step():
        fwd(ids, ids).backward()

    dt = _time(step, 3, 5)
    summary = profile_step(step, out, dt)
    print(
        "RESULT",
        json.dumps({"impl": f"torch-moe-{mode}-profiled", "config": "moe-8x-h200", **summary}),
    )


def main(name: str, mode: str, out: str) -> None:
    if name == "moe":
        return main_moe(mode, out)
    ns = _anchor_namespace()
    layers, hidden, heads, seq, vocab, batch = ns["CONFIGS"][name]
    torch.manual_seed(0)
    model = ns["GPT"](layers, hidden, heads, seq, vocab).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if mode == "compile" else model
    tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
    labels = torch.randint(0, vocab, (batch, seq), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd(tokens, labels)
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    summary = profile_step(step, out, dt)
    print("RESULT", json.dumps({"impl": f"torch-sdpa-{mode}-profiled", "config": name, **summary}))


if __name__ == "__main__":
    main(*sys.argv[1:4])

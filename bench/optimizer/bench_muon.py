"""Muon's (and Lion's) training-optimizer step beside Adam's at a GPT config's parameter shapes.

    python bench/optimizer/bench_muon.py [--config gpt-1.3b] [--optimizers adam muon lion]
        [--muon-fp32-matmul-prec medium] [--muon-num-ns-steps 5] [--device cuda]

The whole `optimizer.step()` of `get_megatron_optimizer` (bf16 params in a one-rank DDP with
fp32 grad buffers holding random grads, fp32 main params, clip at 1.0): for 'muon' the 2-D
weights (QKV, projections, MLP, position embedding) go through Newton-Schulz and the word
embedding, norms and biases through AdamW, as Megatron splits them. Times with CUDA events
(mean of 20 steps after 5 warm-up; wall clock on CPU). Prints one `RESULT {json}` line with the
config, hardware, versions and date. No figures are claimed in the docs until a run on a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench._lib.args import CONFIGS  # noqa: E402
from bench._lib.timing import cuda_ms  # noqa: E402
from bench.optimizer.bench_adamw import GPT_CONFIGS, param_shapes  # noqa: E402


def _step(shapes, device, optimizer: str, options: dict):
    """(step callable, ddp) of the training optimizer `optimizer` over bf16 params of
    `shapes`; the first shape is the word embedding (tagged as Megatron's models tag it)."""
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.model_parallel_config import ModelParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    module = torch.nn.Module()
    module.params = torch.nn.ParameterList(
        torch.nn.Parameter(torch.randn(s, device=device, dtype=torch.bfloat16) * 0.02)
        for s in shapes
    )
    module.params[0].is_embedding_or_output_parameter = True
    ddp = DistributedDataParallel(
        ModelParallelConfig(), DistributedDataParallelConfig(grad_reduce_in_fp32=True), module
    )
    gen = torch.Generator(device=device).manual_seed(1)
    for p in module.parameters():
        p.main_grad.copy_(torch.randn(p.shape, device=device, generator=gen) * 1e-3)
    config = OptimizerConfig(
        optimizer=optimizer,
        lr=1e-4,
        weight_decay=0.1,
        clip_grad=1.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        **(options if optimizer == "muon" else {}),
    )
    return get_megatron_optimizer(config, [ddp]).step, ddp


def _wall_ms(fn, iters: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) * 1e3 / iters


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt-1.3b", choices=GPT_CONFIGS)
    ap.add_argument("--optimizers", nargs="+", default=["adam", "muon", "lion"])
    ap.add_argument("--muon-fp32-matmul-prec", default="medium")
    ap.add_argument("--muon-num-ns-steps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=None, help="override the config's layers")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a = ap.parse_args(argv)
    import torch.distributed as dist

    from gigatron.core import parallel_state

    cfg = dict(CONFIGS[a.config])
    if a.layers is not None:
        cfg["layers"] = a.layers
    shapes = param_shapes(cfg)
    backend = "nccl" if a.device == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    options = dict(
        muon_fp32_matmul_prec=a.muon_fp32_matmul_prec, muon_num_ns_steps=a.muon_num_ns_steps
    )
    out = {"config": a.config, "layers": cfg["layers"], "device": a.device, **options}
    out["params"] = sum(torch.Size(s).numel() for s in shapes)
    for name in a.optimizers:
        step, ddp = _step(shapes, a.device, name, options)
        ms = cuda_ms(step) if a.device == "cuda" else _wall_ms(step)
        out[f"{name}_step_ms"] = round(ms, 3)
        del step, ddp
        if a.device == "cuda":
            torch.cuda.empty_cache()
    if "adam_step_ms" in out:
        for name in a.optimizers:
            out[f"{name}_over_adam"] = round(out[f"{name}_step_ms"] / out["adam_step_ms"], 3)
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    out["hardware"] = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    out["torch"] = torch.__version__
    out["date"] = datetime.date.today().isoformat()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()

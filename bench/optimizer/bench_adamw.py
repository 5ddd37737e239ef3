"""AdamW step time on one GPU for a GPT config's parameter shapes (bf16 params, grads, states).

    python bench/optimizer/bench_adamw.py [--config gpt-1.3b]

The bench's optimizer step (torch.optim.AdamW(fused=True) over the per-parameter tensors, 7 ms
of a 130 ms gpt-1.3b step in the s6 profile) against alternatives, to see what a different
kernel could save: the same fused AdamW over one flat tensor, a torch.compile'd foreach AdamW
step, gigatron's compiled flat update (FlatAdamW's: an Inductor/Triton pointwise kernel), and
gigatron's MultiTensorAdamW (one Triton launch over the per-parameter tensors). Also the step
of gigatron's training optimizer, Megatron's mixed-precision path (`get_megatron_optimizer`:
bf16 model params in DDP buffers, fp32 grad buffers, fp32 main params, clip at 1.0): the
whole `optimizer.step()` (grad views, norm + clip, fused AdamW on the fp32 main params, copy to
the bf16 params) with and without the distributed optimizer, on a one-rank process group.
Times with CUDA events (mean of 20 steps after 5 warm-up); effective bandwidth counts
14 bytes per element (read param, grad, exp_avg, exp_avg_sq; write param, exp_avg,
exp_avg_sq). Prints one `RESULT {json}` line.
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

# GPT-shaped configs only: param_shapes assume multi-head qkv [3h, h], a 4h GELU MLP with biases,
# LayerNorm and learned positions (llama-1b's GQA / SwiGLU / RMSNorm shapes would be wrong)
GPT_CONFIGS = sorted(
    k
    for k, c in CONFIGS.items()
    if not {"kv_heads", "ffn", "swiglu", "rope", "rmsnorm", "bias"} & set(c)
)


def param_shapes(cfg: dict) -> list[tuple[int, ...]]:
    """GPTModel's parameter shapes (learned positions, tied output layer, biases, LayerNorm)."""
    h, v, s = cfg["hidden"], cfg["vocab"], cfg["seq"]
    layer = [(3 * h, h), (3 * h,), (h, h), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,)]
    layer += [(h,)] * 4  # two LayerNorms: weight, bias
    return [(v, h), (s, h)] + layer * cfg["layers"] + [(h,), (h,)]


def compiled_flat(p, g) -> float:
    """ms per step of gigatron's compiled flat AdamW update (FlatAdamW's; exp_avg / exp_avg_sq
    in p's dtype; the step's scalars as FlatAdamW passes them: a small fp32 tensor)."""
    from bench.optimizer.flat_adamw import _update_fn

    m, v = torch.zeros_like(p), torch.zeros_like(p)
    scalars = torch.tensor([1 - 1e-4 * 0.01, 1e-4 / (1 - 0.9), (1 - 0.999) ** 0.5], device=p.device)
    update = _update_fn(compiled=True)
    return cuda_ms(lambda: update(p, g, m, v, scalars, 0.9, 0.999, 1e-8))


def megatron_step(shapes, device, use_distributed_optimizer: bool, flat: bool = False):
    """(step callable, ddp model) of gigatron's training optimizer over params of `shapes` (bf16,
    random, in a DDP model with fp32 grad buffers holding random grads, the same for either
    optimizer kind). `flat`: the distributed optimizer with flat_adam_step=True.
    Needs an initialized process group and parallel_state (one rank is enough)."""
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.model_parallel_config import ModelParallelConfig
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    module = torch.nn.Module()
    module.params = torch.nn.ParameterList(
        torch.nn.Parameter(torch.randn(s, device=device, dtype=torch.bfloat16) * 0.02)
        for s in shapes
    )
    ddp = DistributedDataParallel(
        ModelParallelConfig(),
        DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=use_distributed_optimizer
        ),
        module,
    )
    gen = torch.Generator(device=device).manual_seed(1)
    for p in module.parameters():  # the grads DDP would have reduced into its buffers
        p.main_grad.copy_(torch.randn(p.shape, device=device, generator=gen) * 1e-3)
    config = OptimizerConfig(
        lr=1e-4,
        weight_decay=0.1,
        clip_grad=1.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=use_distributed_optimizer,
        flat_adam_step=flat,
    )
    opt = get_megatron_optimizer(config, [ddp])
    return opt.step, ddp


def _megatron_ms(shapes) -> dict:
    """ms per `optimizer.step()` of gigatron's training optimizer, both kinds (one rank)."""
    import torch.distributed as dist

    from gigatron.core import parallel_state

    # an in-process store: no port, so runs on both GPUs at once do not collide
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    out = {}
    kinds = (("float16", False, False), ("distributed", True, False))
    kinds += (("distributed_flat", True, True),)
    for name, distributed, flat in kinds:
        step, ddp = megatron_step(shapes, "cuda", distributed, flat)
        out[f"megatron_{name}_optimizer_ms"] = round(cuda_ms(step), 3)
        del step, ddp
        torch.cuda.empty_cache()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="gpt-1.3b", choices=GPT_CONFIGS)
    a = ap.parse_args(argv)
    shapes = param_shapes(CONFIGS[a.config])
    n = sum(torch.Size(s).numel() for s in shapes)
    dev, dt = "cuda", torch.bfloat16
    out = {"config": a.config, "params": n, "tensors": len(shapes)}

    def listed():
        ps = [torch.nn.Parameter(torch.randn(s, device=dev, dtype=dt) * 0.02) for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        return ps

    ps = listed()
    opt = torch.optim.AdamW(ps, lr=1e-4, fused=True)
    out["torch_fused_list_ms"] = cuda_ms(opt.step)
    del opt, ps
    flat = [torch.nn.Parameter(torch.randn(n, device=dev, dtype=dt) * 0.02)]
    flat[0].grad = torch.randn_like(flat[0]) * 1e-3
    opt = torch.optim.AdamW(flat, lr=1e-4, fused=True)
    out["torch_fused_flat_ms"] = cuda_ms(opt.step)
    del opt
    out["compiled_flat_ms"] = compiled_flat(flat[0].detach(), flat[0].grad)
    del flat
    ps = listed()
    opt = torch.optim.AdamW(ps, lr=1e-4, foreach=True)
    compiled_step = torch.compile(opt.step)
    out["compiled_foreach_list_ms"] = cuda_ms(compiled_step)
    del opt, compiled_step, ps
    from bench.optimizer.multi_tensor_adamw import MultiTensorAdamW

    ps = listed()
    opt = MultiTensorAdamW(ps, lr=1e-4)
    out["triton_multi_tensor_list_ms"] = cuda_ms(opt.step)
    del opt, ps
    for k in [k for k in out if k.endswith("_ms")]:
        out[k.replace("_ms", "_tb_s")] = round(14 * n / (out[k] * 1e-3) / 1e12, 2)
        out[k] = round(out[k], 3)
    out.update(_megatron_ms(shapes))
    out["gpu"] = torch.cuda.get_device_name()
    out["torch"] = torch.__version__
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()

"""Host (Python) time of the training optimizer's step pieces, as JSON: a CPU proxy for the
host gaps the GPU waits through after the loop's syncs (NaN check, grad norm).

A GPT with gpt-1.3b's parameter count per layer structure (24 layers: 293 tensors) but tiny
tensors (hidden 8), DDP with fp32 grad buffers, the distributed optimizer (bf16 params, fp32
main params, clipping at 1.0), one gloo rank: the compute is negligible, what is timed is the
per-tensor host work. `--flat` uses the flat Adam step (OptimizerConfig.flat_adam_step=True).

    python bench/optimizer/bench_optimizer_host.py [--flat] [--layers 24] [--reps 50]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flat", action="store_true", help="OptimizerConfig.flat_adam_step=True")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    from gigatron.core import parallel_state as ps
    from gigatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from gigatron.core.models.gpt import GPTModel
    from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_fast_spec
    from gigatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from gigatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from gigatron.core.transformer.transformer_config import TransformerConfig
    from gigatron.training._train_step import _nonfinite_grad_ranks

    created = not dist.is_initialized()
    if created:
        init = f"file://{tempfile.mktemp()}"
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)
    torch.set_num_threads(1)
    bf16 = torch.bfloat16
    cfg = TransformerConfig(
        num_layers=a.layers,
        hidden_size=8,
        num_attention_heads=2,
        bf16=True,
        params_dtype=bf16,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    model = GPTModel(cfg, get_gpt_layer_fast_spec(), 16, 8).to(bf16)
    ddp_cfg = DistributedDataParallelConfig(
        use_distributed_optimizer=True, grad_reduce_in_fp32=True, overlap_grad_reduce=True
    )
    ddp = DistributedDataParallel(cfg, ddp_cfg, model)
    opt_cfg = OptimizerConfig(
        lr=1e-4,
        bf16=True,
        params_dtype=bf16,
        use_distributed_optimizer=True,
        clip_grad=1.0,
        flat_adam_step=a.flat,
    )
    opt = get_megatron_optimizer(opt_cfg, [ddp])
    tok = torch.randint(0, 16, (1, 8))
    pos = torch.arange(8).expand(1, 8)

    def backward():
        ddp.zero_grad_buffer()
        opt.zero_grad()
        ddp(tok, pos, None, labels=tok).float().mean().backward()
        ddp.finish_grad_sync()

    for _ in range(3):
        backward()
        opt.step()
    backward()
    pieces = {
        "nan_check_ms": lambda: _nonfinite_grad_ranks([ddp]),
        "prepare_grads_ms": opt.prepare_grads,
        "grads_for_norm_ms": opt.get_main_grads_for_grad_norm,
        "grad_norm_ms": opt.get_grad_norm,
        "step_with_ready_grads_ms": opt.step_with_ready_grads,
        "whole_step_ms": opt.step,
    }
    out = {
        "flat_step": a.flat,
        "tensors": sum(1 for p in model.parameters() if p.requires_grad),
        "torch": torch.__version__,
    }
    for name, fn in pieces.items():
        t0 = time.perf_counter()
        for _ in range(a.reps):
            fn()
        out[name] = round((time.perf_counter() - t0) / a.reps * 1e3, 3)
    ps.destroy_model_parallel()
    if created:
        dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()

"""Mixed precision and gradient accumulation, the Megatron way.

    torchrun --nproc-per-node 2 examples/mixed_precision_grad_accum.py [--microbatches 4]

1. Gradient accumulation = microbatches through the schedule: get_forward_backward_func runs
   forward+backward per microbatch, scales each loss by 1/num_microbatches and lets DDP add the
   grads into `main_grad`; the data-parallel all-reduce happens once, after the last one. The
   script checks that 4 microbatches of 2 give the same gradient as 1 batch of 8 (fp32).
2. bf16 with fp32 main params: the model runs in bf16 (`bf16=True`, Float16Module), the Megatron
   optimizer (`OptimizerConfig(bf16=True)`) keeps an fp32 copy of every bf16 param, steps that
   copy with the fp32 grads (`grad_reduce_in_fp32=True`: DDP accumulates and all-reduces them in
   fp32) and copies the result back to the bf16 model. No loss scaling is
   needed for bf16 (for fp16 use `fp16=True`: dynamic loss scaling, see docs/compat.md).
"""

import argparse

import torch
import torch.distributed as dist
from _common import (
    SEQ,
    forward_step,
    init_distributed,
    mock_batches,
    print_rank0,
    tiny_config,
    tiny_gpt,
    train_step,
    wrap_and_optimizer,
)

from gigatron.core import parallel_state
from gigatron.core.distributed import DistributedDataParallelConfig
from gigatron.core.optimizer import OptimizerConfig
from gigatron.core.pipeline_parallel import get_forward_backward_func
from gigatron.core.transformer.module import Float16Module


def accumulated_grads(micro_batches, num_microbatches):
    """main_grads after one schedule call over `micro_batches` (fp32 model, same init)."""
    ddp, _ = wrap_and_optimizer(tiny_gpt(tiny_config()))
    mbs = micro_batches[0]["tokens"].shape[0]
    ddp.zero_grad_buffer()
    get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(micro_batches), model=ddp,
        num_microbatches=num_microbatches, seq_length=SEQ, micro_batch_size=mbs,
    )  # fmt: skip
    return {n: p.main_grad.clone() for n, p in ddp.module.named_parameters()}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args()
    init_distributed(tensor_model_parallel_size=1)
    dp = parallel_state.get_data_parallel_world_size()
    n, mbs = args.microbatches, 2

    # 1. n microbatches of mbs == one batch of n * mbs
    data = mock_batches(micro_batch_size=mbs)
    micro = [next(data) for _ in range(n)]
    whole = {k: torch.cat([m[k] for m in micro]) for k in micro[0]}
    g_micro = accumulated_grads(micro, n)
    g_whole = accumulated_grads([whole], 1)
    diff = max((g_micro[k] - g_whole[k]).abs().max().item() for k in g_micro)
    print_rank0(f"{n} microbatches of {mbs} vs 1 batch of {n * mbs}: max |grad diff| {diff:.2e}")
    print_rank0(f"gradient accumulation equals the large batch: {diff < 1e-6}")

    # 2. bf16 model, fp32 main params in the optimizer
    config = tiny_config(bf16=True, params_dtype=torch.bfloat16)
    model = Float16Module(config, tiny_gpt(config))
    ddp, optimizer = wrap_and_optimizer(
        model,
        OptimizerConfig(lr=3e-3, weight_decay=0.0, bf16=True, params_dtype=torch.bfloat16),
        DistributedDataParallelConfig(grad_reduce_in_fp32=True),  # fp32 main_grad
    )
    model_param = next(ddp.module.parameters())
    main_param = optimizer.fp32_from_float16_groups[0][0]
    print_rank0(f"model param dtype {model_param.dtype}, optimizer main param dtype "
                f"{main_param.dtype}, main_grad dtype {model_param.main_grad.dtype}")  # fmt: skip
    print_rank0(f"global batch per step = dp {dp} x microbatches {n} x micro batch {mbs}")
    data = mock_batches(micro_batch_size=mbs, seed=1)
    for step in range(args.steps):
        loss, grad_norm, updated = train_step(ddp, optimizer, data, n, mbs)
        print_rank0(f"step {step}: loss {loss:.4f} grad_norm {float(grad_norm):.4f}")
    same = torch.equal(model_param.detach(), main_param.detach().to(torch.bfloat16))
    print_rank0(f"bf16 model param == bf16(fp32 main param) after the steps: {same}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

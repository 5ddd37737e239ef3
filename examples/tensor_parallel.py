"""Tensor parallelism: a Megatron MLP (ColumnParallelLinear -> GeLU -> RowParallelLinear) whose
weights are split over the TP ranks, checked against the same MLP on one device.

    torchrun --nproc-per-node 2 examples/tensor_parallel.py

fc1's weight `[4h, h]` is split by rows (output features): rank r computes its slice of the
hidden activations, no communication. fc2's weight `[h, 4h]` is split by columns (input
features): each rank produces a partial `[s, b, h]` output and one all-reduce sums them. In
backward the roles swap (one all-reduce of the input gradient at fc1). Prints the largest
difference to the unsharded twin for the output, the input gradient and each weight gradient.
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _common import DEVICE, init_distributed, print_rank0

from gigatron.core import parallel_state
from gigatron.core.model_parallel_config import ModelParallelConfig
from gigatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

S, B, H = 8, 2, 16  # s: seq, b: micro-batch, h: hidden


def main():
    tp = int(os.environ["WORLD_SIZE"])
    init_distributed(tensor_model_parallel_size=tp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    config = ModelParallelConfig(tensor_model_parallel_size=tp, use_cpu_initialization=True)

    # Full weights, identical on every rank (same seed): the unsharded twin.
    torch.manual_seed(0)
    w1, w2 = torch.randn(4 * H, H) * 0.1, torch.randn(H, 4 * H) * 0.1  # [4h, h], [h, 4h]
    x = torch.randn(S, B, H, device=DEVICE)  # [s, b, h]

    init = torch.nn.init.zeros_
    fc1 = ColumnParallelLinear(H, 4 * H, config=config, init_method=init, bias=False,
                               gather_output=False).to(DEVICE)  # fmt: skip
    fc2 = RowParallelLinear(4 * H, H, config=config, init_method=init, bias=False,
                            input_is_parallel=True, skip_bias_add=False).to(DEVICE)  # fmt: skip
    with torch.no_grad():
        fc1.weight.copy_(w1.chunk(tp, dim=0)[tp_rank])  # [4h/tp, h]
        fc2.weight.copy_(w2.chunk(tp, dim=1)[tp_rank])  # [h, 4h/tp]
    print(f"tp rank {tp_rank}: fc1.weight {tuple(fc1.weight.shape)}, "
          f"fc2.weight {tuple(fc2.weight.shape)}", flush=True)  # fmt: skip

    x_tp = x.clone().requires_grad_()
    hidden, _ = fc1(x_tp)  # [s, b, 4h/tp]
    out, _ = fc2(F.gelu(hidden))  # [s, b, h], summed over TP ranks
    out.square().sum().backward()

    x_ref = x.clone().requires_grad_()
    w1_ref, w2_ref = w1.to(DEVICE).requires_grad_(), w2.to(DEVICE).requires_grad_()
    out_ref = F.linear(F.gelu(F.linear(x_ref, w1_ref)), w2_ref)
    out_ref.square().sum().backward()

    diffs = {
        "output": (out - out_ref).detach().abs().max(),
        "input grad": (x_tp.grad - x_ref.grad).detach().abs().max(),
        "fc1 weight grad": (fc1.weight.grad - w1_ref.grad.chunk(tp, 0)[tp_rank]).abs().max(),
        "fc2 weight grad": (fc2.weight.grad - w2_ref.grad.chunk(tp, 1)[tp_rank]).abs().max(),
    }
    for name, d in diffs.items():
        dist.all_reduce(d, op=dist.ReduceOp.MAX)
        print_rank0(f"max |tp - single device| {name}: {float(d):.2e}")
    worst = max(float(d) for d in diffs.values())
    print_rank0(f"tensor parallel MLP matches the unsharded MLP: {worst < 1e-5}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

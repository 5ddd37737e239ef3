"""Mixture of experts with expert parallelism: 4 experts, top-2 routing, spread over EP ranks.

    torchrun --nproc-per-node 2 examples/moe_expert_parallel.py [--dispatcher alltoall]

`expert_model_parallel_size` goes both to parallel_state (it builds the expert groups, carved out
of the data-parallel ranks) and to the config. Each rank holds `num_moe_experts / ep` experts;
the token dispatcher sends every token to the ranks holding its top-k experts and brings the
results back (`allgather` or `alltoall`). Attention and the router are replicated, and their
gradients are averaged over data parallel; expert gradients over the expert-data-parallel group.
Prints each rank's experts and the LM losses (the router's aux loss only adds gradients).
"""

import argparse
import os

import torch.distributed as dist
from _common import (
    init_distributed,
    mock_batches,
    print_rank0,
    tiny_config,
    tiny_gpt,
    train_step,
    wrap_and_optimizer,
)

from gigatron.core import parallel_state

NUM_EXPERTS = 4


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dispatcher", default="alltoall", choices=["allgather", "alltoall"])
    args = p.parse_args()
    ep = int(os.environ["WORLD_SIZE"])
    init_distributed(expert_model_parallel_size=ep)
    config = tiny_config(
        num_moe_experts=NUM_EXPERTS,
        moe_router_topk=2,
        expert_model_parallel_size=ep,
        moe_token_dispatcher_type=args.dispatcher,
        moe_router_load_balancing_type="aux_loss",
        moe_aux_loss_coeff=1e-2,
    )
    model = tiny_gpt(config, num_experts=NUM_EXPERTS)
    moe = model.decoder.layers[0].mlp
    print(
        f"rank {dist.get_rank()}: ep rank {parallel_state.get_expert_model_parallel_rank()}, "
        f"holds experts {moe.local_expert_indices} of {NUM_EXPERTS}",
        flush=True,
    )
    ddp, optimizer = wrap_and_optimizer(model)
    data = mock_batches(micro_batch_size=2)
    for step in range(args.steps):
        loss, grad_norm, _ = train_step(ddp, optimizer, data, 2, 2)
        print_rank0(f"step {step}: loss {loss:.4f} grad_norm {float(grad_norm):.4f}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

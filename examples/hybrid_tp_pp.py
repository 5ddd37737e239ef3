"""TP x PP hybrid: a 4-layer GPT with tensor parallel 2 inside each of 2 pipeline stages.

    torchrun --nproc-per-node 4 examples/hybrid_tp_pp.py [--steps 6 --microbatches 4]

Ranks are laid out in Megatron's order `tp-cp-ep-dp-pp` (TP innermost): ranks {0,1} form stage 0,
{2,3} stage 1; ranks 0 and 2 (and 1 and 3) are the pipeline pairs exchanging activations.
Each rank holds half of its stage's attention heads and MLP features. Every extra rank left over
(world size > 4) becomes data parallel. Initialisation does not depend on TP, so
`torchrun --nproc-per-node 2 examples/hybrid_tp_pp.py --tp 1` (pipeline only) prints the same
losses up to float rounding.
"""

import argparse
import os

import torch.distributed as dist
from _common import (
    init_distributed,
    mock_batches,
    print_last_stage,
    tiny_config,
    tiny_gpt,
    train_step,
    wrap_and_optimizer,
)

from gigatron.core import parallel_state


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    if world % (args.tp * args.pp):
        raise ValueError(f"world size ({world}) must be divisible by tp*pp ({args.tp * args.pp})")
    init_distributed(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    ps = parallel_state
    model = tiny_gpt(tiny_config(num_layers=4))
    qkv = model.decoder.layers[0].self_attention.linear_qkv.weight
    print(
        f"rank {dist.get_rank()}: tp rank {ps.get_tensor_model_parallel_rank()}, pp rank "
        f"{ps.get_pipeline_model_parallel_rank()}, dp rank {ps.get_data_parallel_rank()}, "
        f"layers {[layer.layer_number for layer in model.decoder.layers]}, "
        f"linear_qkv {tuple(qkv.shape)}",
        flush=True,
    )
    ddp, optimizer = wrap_and_optimizer(model)
    data = mock_batches(micro_batch_size=2)
    for step in range(args.steps):
        loss, grad_norm, _ = train_step(ddp, optimizer, data, args.microbatches, 2)
        print_last_stage(f"step {step}: loss {loss:.4f} grad_norm {float(grad_norm):.4f}")
    ps.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

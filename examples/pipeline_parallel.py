"""Pipeline parallelism: a 4-layer GPT split over pipeline stages, trained with 1F1B.

    torchrun --nproc-per-node 2 examples/pipeline_parallel.py [--steps 4 --microbatches 4]

Each rank builds only its stage (`pre_process` on the first: embedding; `post_process` on the
last: output layer + loss) and its layers (`num_layers / pp` of them). get_forward_backward_func
picks the 1F1B schedule when pp > 1: activations go forward and gradients backward between
neighbouring stages through p2p send/recv, over `--microbatches` microbatches per step. Losses
exist only on the last stage. Gloo on CPU, nccl on GPUs.
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
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--microbatches", type=int, default=4)
    args = p.parse_args()
    init_distributed(pipeline_model_parallel_size=int(os.environ["WORLD_SIZE"]))
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    model = tiny_gpt(tiny_config(num_layers=4))
    layers = [layer.layer_number for layer in model.decoder.layers]
    print(
        f"pp rank {pp_rank}: layers {layers}, embedding {model.pre_process}, "
        f"output layer {model.post_process}",
        flush=True,
    )
    ddp, optimizer = wrap_and_optimizer(model)
    data = mock_batches(micro_batch_size=2)
    for step in range(args.steps):
        loss, grad_norm, _ = train_step(ddp, optimizer, data, args.microbatches, 2)
        print_last_stage(f"step {step}: loss {loss:.4f} grad_norm {float(grad_norm):.4f}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

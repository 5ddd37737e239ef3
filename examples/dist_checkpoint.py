"""Distributed checkpointing: save a GPT at one parallel layout, load it at another.

    torchrun --nproc-per-node 2 examples/dist_checkpoint.py [--ckpt-dir DIR]

Saved at TP=2 (each rank writes its halves of the split weights), loaded at TP=1 x DP=2 (each
rank reads whole tensors). `model.sharded_state_dict()` describes every tensor by its key, its
global shape and this rank's offset in it, so `dist_checkpointing.load` can reassemble any other
split. Prints the per-token losses of the same batch before saving and after loading (equal).
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from _common import DEVICE, SEQ, init_distributed, mock_batches, print_rank0, tiny_config, tiny_gpt

from gigatron.core import dist_checkpointing, parallel_state


def per_token_loss(model, batch):
    with torch.no_grad():
        return model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])  # [b, s]


def main():
    p = argparse.ArgumentParser()
    default_dir = os.path.join(tempfile.gettempdir(), "gigatron_dist_ckpt_example")
    p.add_argument("--ckpt-dir", default=default_dir)
    args = p.parse_args()
    world = int(os.environ["WORLD_SIZE"])

    init_distributed(tensor_model_parallel_size=world)
    model = tiny_gpt(tiny_config())
    with torch.no_grad():  # move away from the seeded init, so the load has something to prove
        for param in model.parameters():
            param.add_(0.01 * torch.randn_like(param))
    batch = next(mock_batches(micro_batch_size=2))
    before = per_token_loss(model, batch)
    qkv = model.decoder.layers[0].self_attention.linear_qkv.weight
    print_rank0(f"saving at TP={world}: linear_qkv per rank {tuple(qkv.shape)}")
    if dist.get_rank() == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(model.sharded_state_dict(), args.ckpt_dir)

    init_distributed(tensor_model_parallel_size=1)  # same ranks, now TP=1 x DP=world
    model = tiny_gpt(tiny_config())
    fresh = per_token_loss(model, batch)
    model.load_state_dict(dist_checkpointing.load(model.sharded_state_dict(), args.ckpt_dir))
    after = per_token_loss(model, batch)
    qkv = model.decoder.layers[0].self_attention.linear_qkv.weight
    print_rank0(f"loaded at TP=1, DP={world}: linear_qkv per rank {tuple(qkv.shape)}")
    print_rank0(f"mean loss before save {before.mean():.6f}, fresh model {fresh.mean():.6f}, "
                f"after load {after.mean():.6f} (seq {SEQ}, device {DEVICE})")  # fmt: skip
    diff = (after - before).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    print_rank0(f"max |loss after load - loss before save| = {float(diff):.2e}")
    print_rank0(f"loaded at a different layout equal: {float(diff) < 1e-5}")
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

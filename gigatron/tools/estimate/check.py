"""Measure what `gigatron estimate` predicts: the peak tensor bytes of real training steps.

`measure_training_peak(argv)` runs on every rank of an initialised torch.distributed world (gloo
CPU ranks in the tests): Megatron flags -> groups -> model, DDP and optimizer built by
`gigatron.training` under `LiveTensorBytes` -> `num_steps` train_steps on random tokens. Returns
this rank's peak bytes after the model is built (construction's one-off copies left out), the
bytes alive once the model, DDP and optimizer exist, and the coordinates the estimate is for.
"""

from __future__ import annotations

import torch

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import finalize_model_grads
from gigatron.core.num_microbatches_calculator import (
    init_num_microbatches_calculator,
    unset_num_microbatches_calculator,
)
from gigatron.core.utils import get_model_config
from gigatron.tools.estimate.measure import LiveTensorBytes
from gigatron.training import global_vars
from gigatron.training.arguments import parse_args, validate_args
from gigatron.training.pretrain_gpt import forward_step, model_provider
from gigatron.training.training import setup_model_and_optimizer, train_step
from gigatron.training.utils import PARALLEL_SIZE_FLAGS, args_by_name


def _batches(args, seed: int):
    g = torch.Generator().manual_seed(seed)
    b, s, v = args.micro_batch_size, args.seq_length, args.padded_vocab_size
    while True:
        tokens = torch.randint(0, v, (b, s), generator=g)
        yield {
            "tokens": tokens,
            "labels": torch.roll(tokens, -1, dims=1),
            "loss_mask": torch.ones(b, s),
            "position_ids": torch.arange(s).expand(b, s),
        }


def measure_training_peak(argv: list[str], *, num_steps: int = 2) -> dict:
    """Peak live tensor bytes of `num_steps` training steps on this rank (see the module doc)."""
    import torch.distributed as dist

    from gigatron.tools.estimate.args import padded_vocab_size

    args = parse_args(argv=[*argv, "--mock-data", "--lr", "1e-4", "--train-iters", "10"])
    validate_args(args, dist.get_world_size())
    args.padded_vocab_size = padded_vocab_size(args)
    args.iteration = 0
    global_vars.set_args(args)
    ps.initialize_model_parallel(
        **args_by_name(args, PARALLEL_SIZE_FLAGS),
    )
    unset_num_microbatches_calculator()
    init_num_microbatches_calculator(
        0, None, args.global_batch_size, args.micro_batch_size, args.data_parallel_size
    )
    torch.manual_seed(1234)
    try:
        with LiveTensorBytes() as mem:
            model, optimizer, scheduler = setup_model_and_optimizer(model_provider)
            config = get_model_config(model[0])
            config.no_sync_func = (
                model[0].no_sync if len(model) == 1 else [m.no_sync for m in model]
            )
            config.finalize_model_grads_func = finalize_model_grads
            mem.reset_peak()
            static = mem.live
            data = _batches(args, 7 + ps.get_data_parallel_rank())
            iters = [data] * len(model) if len(model) > 1 else data
            for _ in range(num_steps):
                args.iteration += 1
                train_step(forward_step, iters, model, optimizer, scheduler, config)
        return {
            "rank": dist.get_rank(),
            "peak_bytes": mem.peak,
            "static_bytes": static,
            "pp_rank": ps.get_pipeline_model_parallel_rank(),
        }
    finally:
        unset_num_microbatches_calculator()
        ps.destroy_model_parallel()
        global_vars.set_args(None)

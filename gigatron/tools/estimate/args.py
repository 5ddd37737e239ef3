"""`gigatron estimate`'s flags: every `gigatron train` flag (Megatron's pretrain_gpt parser,
reused as is) plus the planner's own, validated the way training validates them."""

from __future__ import annotations

import argparse
import math

from gigatron.training.arguments import parse_args, validate_args


def add_estimate_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = p.add_argument_group("estimate (gigatron estimate only)")
    g.add_argument("--world-size", type=int, default=None, help="ranks of the planned job")
    g.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (NVLink domain)")
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="check every rank's layout on fake process groups (groups, nodes, schedule, "
        "sharded state dict) and report each rank's memory",
    )
    g.add_argument(
        "--calibration",
        default=None,
        help="a calibration JSON (bench/estimate/calibrate.py) for the step-time estimate",
    )
    g.add_argument("--gpu-memory-gib", type=float, default=None, help="flag ranks above this")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def padded_vocab_size(args) -> int:
    """The tokenizer's vocabulary padded as training pads it (to make-vocab-size-divisible-by x
    TP). Without --tokenizer-type (or with NullTokenizer) training builds Megatron's
    NullTokenizer, whose EOD is one id past --vocab-size; another tokenizer's size is taken to
    be --vocab-size."""
    from gigatron.core.models.common.vocab_utils import vocab_size_with_padding

    if args.vocab_size is None:
        raise ValueError("give --vocab-size N (gigatron estimate builds no tokenizer)")
    null = args.tokenizer_type in (None, "NullTokenizer")
    return vocab_size_with_padding(
        args.vocab_size + int(null),
        args.make_vocab_size_divisible_by,
        args.tensor_model_parallel_size,
    )


def estimate_args(argv: list[str]) -> argparse.Namespace:
    """Parsed and validated flags; training-only requirements (data, --lr, iterations) filled
    with placeholders, since nothing is trained."""
    args = parse_args(add_estimate_args, argv=argv)
    if args.world_size is None:
        raise ValueError("give --world-size N (the number of ranks of the planned job)")
    if args.world_size < 1:
        raise ValueError(f"--world-size ({args.world_size}) must be >= 1")
    if args.gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node ({args.gpus_per_node}) must be >= 1")
    gib = args.gpu_memory_gib
    if gib is not None and not (math.isfinite(gib) and gib > 0):
        raise ValueError(f"--gpu-memory-gib ({gib}) must be a finite number > 0")
    world_size = args.world_size
    args.mock_data = True
    if args.lr is None:
        args.lr = 1e-4
    if args.train_iters is None and args.train_samples is None:
        args.train_iters = 1
    validate_args(args, world_size)
    args.world_size = world_size
    args.padded_vocab_size = padded_vocab_size(args)
    return args

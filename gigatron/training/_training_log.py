"""What the training loop prints and records: log lines, progress bar, TensorBoard, W&B.

One line every `--log-interval` iterations with iteration, consumed samples, ms/iter, learning
rate, loss values, grad norm, skipped and NaN counts, tokens/s, TFLOP/s per GPU, MFU and memory.
Also the TensorBoard scalars behind Megatron's `--log-*-to-tensorboard` flags (loss scale,
world size, memory, validation perplexity).
"""

from __future__ import annotations

import math
import os
import resource
import sys

import torch

from gigatron.training import global_vars
from gigatron.training.flops import FORMULA, device_peak_flops, num_floating_point_operations
from gigatron.training.utils import is_last_rank, print_rank_0, print_rank_last


def memory_string() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        gib = torch.cuda.max_memory_allocated() / 2**30
        return f"max GPU memory {gib:.2f} GiB"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    return f"max RSS {rss:.2f} GiB"


def print_flops_formula(args) -> None:
    peak = device_peak_flops()
    per_step = num_floating_point_operations(args, args.global_batch_size)
    peak_s = (
        f"{peak / 1e12:.0f} TFLOP/s per GPU (dense bf16 datasheet)" if peak else "unknown (CPU)"
    )
    print_rank_0(
        f"FLOPs per step: {per_step:.4g} = {FORMULA}; MFU = achieved TFLOP/s per device / peak; "
        f"peak: {peak_s}"
    )


class ProgressBar:
    """tqdm over iterations on the last rank when tqdm is installed and stderr is a terminal;
    otherwise nothing (log lines still show progress). The loss it shows is the last one read
    at a log line (reading it every iteration would cost a host sync each)."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self.bar = None
        if not enabled or not is_last_rank() or not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self.bar = tqdm(
            total=total, initial=initial, unit="it", file=sys.stderr, dynamic_ncols=True
        )

    def update(self, loss: float | None) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if loss is not None:
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def tb_writer():
    """The TensorBoard writer (None unless `--tensorboard-dir` on the last rank)."""
    return global_vars.get_tensorboard_writer()


def setup_writers(args) -> None:
    if args.tensorboard_dir and is_last_rank():
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise RuntimeError(
                "--tensorboard-dir needs the tensorboard package: pip install 'gigatron[log]'"
            ) from e
        global_vars.set_tensorboard_writer(SummaryWriter(log_dir=args.tensorboard_dir))
    if args.wandb_project and is_last_rank():
        try:
            import wandb
        except ImportError as e:
            raise RuntimeError("--wandb-project needs wandb: pip install wandb") from e
        wandb.init(
            project=args.wandb_project,
            name=args.wandb_exp_name,
            dir=args.wandb_save_dir or os.getcwd(),
            config=vars(args),
            mode=os.environ.get("WANDB_MODE", "online"),
        )
        global_vars.set_wandb_writer(wandb)


def training_log(args, stats: dict, iteration: int, elapsed_s: float, iters: int, bar) -> None:
    """Print one log line (last rank, where losses live) and write scalars."""
    per_iter = elapsed_s / max(iters, 1)
    tokens = args.global_batch_size * args.seq_length
    flops = num_floating_point_operations(args, args.global_batch_size)
    tflops_per_device = flops / per_iter / 1e12 / args.world_size
    peak = device_peak_flops()
    mfu = f"{100 * tflops_per_device * 1e12 / peak:.1f}%" if peak else "n/a"
    parts = [
        f"iteration {iteration:8d}/{args.train_iters:8d}",
        f"consumed samples: {args.consumed_train_samples:10d}",
        f"elapsed time per iteration (ms): {per_iter * 1000:.1f}",
        f"learning rate: {stats['lr']:.6E}",
    ]
    for key, value in stats["losses"].items():
        parts.append(f"{key}: {value:.6E}")
    if stats.get("loss_scale") is not None:
        parts.append(f"loss scale: {stats['loss_scale']:.1f}")
    if stats.get("grad_norm") is not None:
        parts.append(f"grad norm: {stats['grad_norm']:.3f}")
    if stats.get("num_zeros") is not None:
        parts.append(f"num zeros: {stats['num_zeros']}")
    if stats.get("params_norm") is not None:  # --log-params-norm, where Megatron prints it
        parts.append(f"params norm: {stats['params_norm']:.3f}")
    parts += [
        f"number of skipped iterations: {stats['skipped']:3d}",
        f"number of nan iterations: {stats['nan']:3d}",
        f"tokens/s: {tokens / per_iter:.0f}",
        f"throughput per GPU (TFLOP/s/GPU): {tflops_per_device:.3f}",
        f"MFU: {mfu}",
        memory_string(),
    ]
    if is_last_rank():
        bar.write(" | ".join(parts))
    writer = global_vars.get_tensorboard_writer()
    scalars = {
        "learning-rate": stats["lr"],
        "tokens-per-sec": tokens / per_iter,
        "throughput-tflops": tflops_per_device,
        **stats["losses"],
    }
    if stats.get("grad_norm") is not None:
        scalars["grad-norm"] = stats["grad_norm"]
    if stats.get("params_norm") is not None:
        scalars["params-norm"] = stats["params_norm"]
    if writer is not None:
        for key, value in scalars.items():
            writer.add_scalar(key, value, iteration)
        writer.flush()
    wandb = global_vars.get_wandb_writer()
    if wandb is not None:
        wandb.log(scalars, step=iteration)


def log_validation(args, prefix: str, losses: dict, iteration: int, suffix: str = "") -> None:
    """The line "validation<suffix> loss at <prefix> | <key> value: ... | <key> PPL: ..." and
    the "<key> validation<suffix>" scalars (suffix "-<set>" with --multiple-validation-sets)."""
    import math

    parts = [f"validation{suffix} loss at {prefix}"]
    for key, value in losses.items():
        parts.append(f"{key} value: {value:.6E} | {key} PPL: {math.exp(min(20.0, value)):.6E}")
    print_rank_last(" | ".join(parts))
    writer = global_vars.get_tensorboard_writer()
    if writer is not None:
        for key, value in losses.items():
            writer.add_scalar(f"{key} validation{suffix}", value, iteration)
    wandb = global_vars.get_wandb_writer()
    if wandb is not None:
        wandb.log({f"{k} validation{suffix}": v for k, v in losses.items()}, step=iteration)


def write_extra_scalars(args, writer, iteration: int, stats: dict) -> None:
    """The TensorBoard scalars Megatron writes beyond gigatron's log line set: loss scale (on by
    default; `--no-log-loss-scale-to-tensorboard`), world size and memory. (The params norm is
    written with the losses: the loop shows it after them.)"""
    if writer is None:
        return
    if stats.get("loss_scale") is not None and getattr(args, "log_loss_scale_to_tensorboard", 1):
        writer.add_scalar("loss-scale", stats["loss_scale"], iteration)
    if getattr(args, "log_world_size_to_tensorboard", False):
        writer.add_scalar("world-size", args.world_size, iteration)
    if getattr(args, "log_memory_to_tensorboard", False):
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            writer.add_scalar("mem-allocated-bytes", torch.cuda.memory_allocated(), iteration)
            writer.add_scalar(
                "mem-max-allocated-bytes", torch.cuda.max_memory_allocated(), iteration
            )
            writer.add_scalar("mem-reserved-bytes", torch.cuda.memory_reserved(), iteration)
        else:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB -> bytes
            writer.add_scalar("mem-max-rss-bytes", rss, iteration)


def write_validation_ppl(args, writer, iteration: int, losses: dict) -> None:
    """`--log-validation-ppl-to-tensorboard`: exp(loss) per validation loss (Megatron clips the
    exponent at 20, as the log line does)."""
    if writer is None or not getattr(args, "log_validation_ppl_to_tensorboard", False):
        return
    for key, value in losses.items():
        writer.add_scalar(f"{key} validation ppl", math.exp(min(20.0, value)), iteration)

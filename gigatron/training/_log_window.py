"""What `training.train()` keeps between log lines: each iteration's record and the log window.

Each iteration appends one history entry (`args.train_history`): its losses, skipped / NaN
flags and grad norm. Losses are device tensors (and under `--sync-free-step` so are the norm
and the flags): reading them waits for the step, so `LogWindow` keeps the entries not yet read
and reads them all with one host sync when the loop logs, saves or stops.
"""

from __future__ import annotations

import time

import torch

from gigatron.core.num_microbatches_calculator import get_num_microbatches
from gigatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
from gigatron.training import _training_log as tlog
from gigatron.training import global_vars
from gigatron.training._train_step import materialize_losses
from gigatron.training.utils.common_utils import params_l2_norm


# ---------------------------------------------------------------- one iteration's record
def step_record(args, config, iteration: int, step_result) -> dict:
    """The history entry of `iteration` from train_step's (losses, skipped, grad_norm, _, nan),
    with the MoE aux / z losses of the iteration joined to its losses."""
    losses, skipped, grad_norm, _, nan_iter = step_result
    if grad_norm is not None and not isinstance(grad_norm, torch.Tensor):
        grad_norm = float(grad_norm)  # a device tensor with the sync-free step: read when logging
    return {
        "iteration": iteration,
        "losses": {**losses, **moe_losses(args, config, iteration), **mtp_losses(args, iteration)},
        "skipped": skipped,
        "nan": nan_iter,
        "grad_norm": grad_norm,
    }


def moe_losses(args, config, iteration: int) -> dict[str, torch.Tensor]:
    """MoE aux / z losses of this iteration, averaged over MoE layers (every rank calls it:
    the tracker reduces across ranks), also written to TensorBoard / W&B, per layer if asked.
    Device tensors, read with the other losses when the loop logs (no host sync here unless a
    writer is configured: it records every iteration, as Megatron's)."""
    if not args.num_experts:
        return {}
    from gigatron.core.transformer.moe.moe_utils import track_moe_metrics

    totals: dict = {}
    track_moe_metrics(
        loss_scale=1.0 / get_num_microbatches(),
        iteration=iteration,
        writer=global_vars.get_tensorboard_writer(),
        wandb_writer=global_vars.get_wandb_writer(),
        total_loss_dict=totals,
        per_layer_logging=config.moe_per_layer_logging,
        num_layers=config.num_layers,
        moe_layer_freq=config.moe_layer_freq,
    )
    return {
        name: torch.as_tensor(value).detach().float().reshape(()) for name, value in totals.items()
    }


def mtp_losses(args, iteration: int) -> dict[str, torch.Tensor]:
    """`mtp_{k} loss` of this iteration per MTP depth (the mean over micro-batches, averaged
    over DP x CP), also written to TensorBoard / W&B with the acceptance rates; empty on stages
    without the MTP block (the log line is printed by the last rank, which holds it)."""
    if not getattr(args, "mtp_num_layers", None):
        return {}
    totals: dict = {}
    MTPLossLoggingHelper.track_mtp_metrics(
        loss_scale=1.0 / get_num_microbatches(),
        iteration=iteration,
        writer=global_vars.get_tensorboard_writer(),
        wandb_writer=global_vars.get_wandb_writer(),
        total_loss_dict=totals,
    )
    return {name: value.detach().float().reshape(()) for name, value in totals.items()}


# ---------------------------------------------------------------- the log window
class LogWindow:
    """The iterations since the last log line: their entries (`pending`: values maybe still on
    the device), skipped / NaN counts and wall time; one log line per `--log-interval`."""

    def __init__(self, args, bar: tlog.ProgressBar) -> None:
        self.args, self.bar = args, bar
        self.pending: list[dict] = []
        self._restart()

    def _restart(self) -> None:
        self.pending, self.counts = [], {"skipped": 0, "nan": 0}
        self.start, self.num_iters = time.perf_counter(), 0

    def read(self) -> None:
        """Read the pending device values (one host sync); raises NonFiniteGradientError for a
        step the sync-free step skipped, unless `--skip-nan-steps`."""
        materialize_losses(self.pending)

    def add(self, entry: dict, *, model, optimizer, num_zeros) -> None:
        """Record one iteration; on a log iteration read the window and write the log line."""
        args = self.args
        self.pending.append(entry)
        self.counts["skipped"] += entry["skipped"]
        self.counts["nan"] += entry["nan"]
        self.num_iters += 1
        log_now = entry["iteration"] % args.log_interval == 0
        # --log-params-norm, on every rank: the norm is reduced over the model-parallel group
        if log_now and getattr(args, "log_params_norm", False):
            entry["params_norm"] = params_l2_norm(model, bf16=args.bf16)
        if log_now:  # the one host sync for the losses of the window
            self.read()
        shown = next(iter(entry["losses"].values()), None)  # a bar shows losses already read
        self.bar.update(shown if isinstance(shown, float) else None)
        if log_now:
            self._log(entry, optimizer, num_zeros)

    def _log(self, entry: dict, optimizer, num_zeros) -> None:
        args, iteration = self.args, entry["iteration"]
        stats = {
            "lr": optimizer.param_groups[0]["lr"],
            "losses": window_mean(self.pending),
            "grad_norm": entry["grad_norm"],  # read by materialize_losses
            "num_zeros": num_zeros,
            "params_norm": entry.get("params_norm"),
            "loss_scale": optimizer.get_loss_scale().item() if args.fp16 else None,
            **{key: int(value) for key, value in self.counts.items()},
        }
        elapsed = time.perf_counter() - self.start
        tlog.training_log(args, stats, iteration, elapsed, self.num_iters, self.bar)
        tlog.write_extra_scalars(args, tlog.tb_writer(), iteration, stats)
        self._restart()


def window_mean(entries: list[dict]) -> dict[str, float]:
    """Each loss averaged over the log window's iterations that updated the weights, as
    Megatron's log line reports it (a window of skipped steps only: its last losses)."""
    kept = [e for e in entries if not e["skipped"]] or entries[-1:]
    sums: dict[str, list[float]] = {}
    for e in kept:
        for key, value in e["losses"].items():
            sums.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in sums.items()}

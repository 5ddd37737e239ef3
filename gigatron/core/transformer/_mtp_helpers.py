"""The pieces of multi-token prediction that are not modules: the one-token roll of ids, labels
and masks (across context-parallel ranks and packed documents), the auto-scaler that attaches
the MTP losses to the main loss's backward, and the loss / acceptance-rate tracker the training
log reads. Re-exported by `gigatron.core.transformer.multi_token_prediction` under Megatron's
names (`roll_tensor`, `MTPLossAutoScaler`, `MTPLossLoggingHelper`).

Shapes: b: micro-batch, s: sequence on this rank (s / cp under context parallelism), V/tp: the
vocabulary slice of this tensor-parallel rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


# ---------------------------------------------------------------- roll
def roll_tensor(
    tensor: Tensor | None,
    shifts: int = -1,
    dims: int = -1,
    cp_group=None,
    packed_seq_params=None,
    return_sum: bool = True,
) -> tuple[Tensor | None, Tensor | None]:
    """Shift `tensor` one token left along `dims` (the sequence); the freed last slot is 0.

    Under context parallelism (`cp_group` of size cp > 1) this rank holds the load-balanced
    chunks r and 2cp-1-r of each sequence (get_batch_on_this_cp_rank's layout), as two halves
    of its local sequence: each half's new last element is the first element of the chunk that
    follows it, received from rank r+1 (first half) or r-1 (second half). With
    `packed_seq_params` (thd, cp = 1) each document rolls inside its own bounds.

    Returns (rolled tensor, its sum or None without `return_sum`)."""
    if tensor is None:
        return None, None
    if shifts != -1:
        raise ValueError(f"roll_tensor: shifts ({shifts}) must be -1 (one token left)")
    cp = 1 if cp_group is None else dist.get_world_size(cp_group)
    if packed_seq_params is not None:
        rolled = _roll_packed(tensor, dims, packed_seq_params, cp)
    elif cp == 1:
        rolled = torch.roll(tensor, shifts=-1, dims=dims)
        rolled.select(dims, -1).fill_(0)
    else:
        rolled = _roll_across_cp(tensor, dims, cp_group, cp)
    return rolled, (rolled.sum() if return_sum else None)


def _roll_across_cp(tensor: Tensor, dims: int, cp_group, cp: int) -> Tensor:
    halves = [torch.roll(h, shifts=-1, dims=dims) for h in tensor.chunk(2, dim=dims)]
    sends = [h.select(dims, -1).contiguous() for h in halves]  # each chunk's first element
    recvs = [torch.empty_like(s) for s in sends]
    ranks = dist.get_process_group_ranks(cp_group)
    rank = dist.get_rank(cp_group)
    ops = []
    if rank > 0:  # chunk r-1 ... of the previous rank: trade first-half start for second-half end
        ops.append(dist.P2POp(dist.isend, sends[0], ranks[rank - 1], cp_group))
        ops.append(dist.P2POp(dist.irecv, recvs[1], ranks[rank - 1], cp_group))
    else:
        recvs[1] = torch.zeros_like(sends[1])  # the sequence's last chunk: nothing follows
    if rank < cp - 1:
        ops.append(dist.P2POp(dist.irecv, recvs[0], ranks[rank + 1], cp_group))
        ops.append(dist.P2POp(dist.isend, sends[1], ranks[rank + 1], cp_group))
    else:
        recvs[0] = sends[1]  # chunks cp-1 and cp sit side by side on the last rank
    for work in dist.batch_isend_irecv(ops) if ops else ():
        work.wait()
    for half, value in zip(halves, recvs, strict=True):
        half.select(dims, -1).copy_(value)
    return torch.cat(halves, dim=dims)


def _roll_packed(tensor: Tensor, dims: int, packed_seq_params, cp: int) -> Tensor:
    if cp > 1:
        raise ValueError(
            f"multi-token prediction with packed sequences (thd) and context_parallel_size "
            f"({cp}) > 1 is not implemented in gigatron; use cp = 1 or unpacked sequences"
        )
    if dims not in (-1, tensor.dim() - 1):
        raise ValueError(f"roll_tensor: packed sequences roll the last dim only, got {dims}")
    bounds = packed_seq_params.cu_seqlens_q.tolist()
    rolled = tensor.clone()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            rolled[..., start : end - 1] = tensor[..., start + 1 : end]
            rolled[..., end - 1] = 0
    return rolled


# ---------------------------------------------------------------- the loss's backward
# The tensor MTPLossAutoScaler's backward reads (a module global, as moe_utils' _BACKWARD_SCALE,
# so a compiled graph lifts it); changed in place once it exists.
_BACKWARD_SCALE: dict[str, Tensor] = {}


class MTPLossAutoScaler(torch.autograd.Function):
    """Attach an MTP loss to an activation: identity forward; backward gives the loss the
    gradient `main_loss_backward_scale` (the main loss's: loss scale / num_microbatches, set by
    the pipeline schedules through `set_loss_scale`; 1.0 before any was set).

    forward:  (output [..], mtp_loss [b, s]) -> output
    backward: grad_output -> (grad_output, ones_like(mtp_loss) * scale)
    """

    main_loss_backward_scale: Tensor | None = None

    @staticmethod
    def forward(ctx, output: Tensor, mtp_loss: Tensor) -> Tensor:
        ctx.save_for_backward(mtp_loss)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (mtp_loss,) = ctx.saved_tensors
        scale = _BACKWARD_SCALE.get("scale")
        if scale is None:
            return grad_output, torch.ones_like(mtp_loss)
        return grad_output, torch.ones_like(mtp_loss) * scale.to(mtp_loss.device)

    @staticmethod
    def set_loss_scale(scale: Tensor) -> None:
        """Set the scale of the MTP loss gradients (must match the main loss's scaling)."""
        scale = scale.detach().reshape(()) if torch.is_tensor(scale) else torch.tensor(scale)
        scale = scale.float()
        current = _BACKWARD_SCALE.get("scale")
        if current is None or current.device != scale.device:
            current = scale.clone()
            _BACKWARD_SCALE["scale"] = current
        else:
            current.copy_(scale)
        MTPLossAutoScaler.main_loss_backward_scale = current


# ---------------------------------------------------------------- logging
class MTPLossLoggingHelper:
    """Per-depth MTP losses and acceptance counts of the current iteration (summed over its
    micro-batches), reduced and written once per iteration by `track_mtp_metrics`."""

    tracker: dict = {}

    @staticmethod
    def save_metrics_to_tracker(
        loss: Tensor,
        correct: Tensor,
        total: Tensor,
        layer_number: int | None,
        num_layers: int,
        reduce_group=None,
        avg_group=None,
    ) -> None:
        """Add depth `layer_number`'s (0-based) mean loss and correct / total predictions."""
        if layer_number is None:
            return
        tracker = MTPLossLoggingHelper.tracker
        for key in ("loss_values", "correct_values", "total_values"):
            if key not in tracker or tracker[key].numel() != num_layers:
                tracker[key] = torch.zeros(num_layers, device=loss.device)
        tracker["loss_values"][layer_number] += loss.detach().float()
        tracker["correct_values"][layer_number] += correct.detach().float()
        tracker["total_values"][layer_number] += total.detach().float()
        tracker["reduce_group"] = reduce_group
        tracker["avg_group"] = avg_group

    @staticmethod
    def clean_metrics_in_tracker() -> None:
        tracker = MTPLossLoggingHelper.tracker
        for key in ("loss_values", "correct_values", "total_values"):
            if key in tracker:
                tracker[key].zero_()
        tracker["reduce_group"] = None
        tracker["avg_group"] = None

    @staticmethod
    def reduce_metrics_in_tracker() -> None:
        """Losses: summed over `reduce_group`, averaged over `avg_group` (DP x CP); counts:
        summed over both."""
        tracker = MTPLossLoggingHelper.tracker
        if "loss_values" not in tracker:
            return
        reduce_group, avg_group = tracker.get("reduce_group"), tracker.get("avg_group")
        for key in ("loss_values", "correct_values", "total_values"):
            values = tracker[key]
            if reduce_group is not None:
                dist.all_reduce(values, group=reduce_group)
            if avg_group is not None:
                dist.all_reduce(values, group=avg_group)
                if key == "loss_values":
                    values.div_(dist.get_world_size(avg_group))

    @staticmethod
    def track_mtp_metrics(loss_scale, iteration, writer, wandb_writer=None, total_loss_dict=None):
        """Write `mtp_{k} loss` (scaled by `loss_scale`, 1 / num_microbatches in training) and
        the step / cumulative acceptance rates (%) of each depth; add the losses to
        `total_loss_dict`; then clear the iteration's values."""
        MTPLossLoggingHelper.reduce_metrics_in_tracker()
        tracker = MTPLossLoggingHelper.tracker
        if "loss_values" not in tracker:
            return
        losses = tracker["loss_values"] * loss_scale
        corrects, totals = tracker["correct_values"], tracker["total_values"]
        for key, now in (("cumulative_correct_values", corrects),
                         ("cumulative_total_values", totals)):  # fmt: skip
            if key not in tracker or tracker[key].shape != now.shape:
                tracker[key] = torch.zeros_like(now)
            tracker[key] += now
        cum_corrects, cum_totals = (
            tracker["cumulative_correct_values"],
            tracker["cumulative_total_values"],
        )
        for i in range(losses.shape[0]):
            name = f"mtp_{i + 1} loss"
            step_rate = corrects[i] / totals[i].clamp(min=1) * 100.0
            cum_rate = cum_corrects[i] / cum_totals[i].clamp(min=1) * 100.0
            if total_loss_dict is not None:
                total_loss_dict[name] = total_loss_dict.get(name, 0) + losses[i]
            scalars = {
                name: losses[i],
                f"mtp_{i + 1}_acceptance_rate": step_rate,
                f"mtp_{i + 1}_cumulative_acceptance_rate": cum_rate,
            }
            for key, value in scalars.items():
                if writer is not None:
                    writer.add_scalar(key, value, iteration)
                if wandb_writer is not None:
                    wandb_writer.log({key: value}, iteration)
        MTPLossLoggingHelper.clean_metrics_in_tracker()


def compute_mtp_acceptance_counts(
    mtp_logits: Tensor, mtp_labels: Tensor, loss_mask: Tensor, vocab_sharded: bool, tp_group
) -> tuple[Tensor, Tensor]:
    """(correct, total) greedy predictions of one depth: logits [s, b, V/tp] (V when not
    `vocab_sharded`), labels / loss_mask [b, s]; the argmax spans the whole vocabulary."""
    with torch.no_grad():
        tp = dist.get_world_size(tp_group) if tp_group is not None else 1
        if vocab_sharded and tp > 1:
            preds = _vocab_parallel_argmax(mtp_logits, tp_group, tp)
        else:
            preds = mtp_logits.argmax(dim=-1)  # [s, b]
        valid = loss_mask.transpose(0, 1).bool()  # [s, b]
        correct = ((preds == mtp_labels.transpose(0, 1)) & valid).sum().float()
        return correct, valid.sum().float()


def _vocab_parallel_argmax(logits: Tensor, tp_group, tp: int) -> Tensor:
    """Global argmax [s, b] of logits split over the vocabulary ([s, b, V/tp] per rank)."""
    best, where = logits.max(dim=-1)  # [s, b] each
    all_best = [torch.empty_like(best) for _ in range(tp)]
    all_where = [torch.empty_like(where) for _ in range(tp)]
    dist.all_gather(all_best, best, group=tp_group)
    dist.all_gather(all_where, where, group=tp_group)
    winner = torch.stack(all_best).argmax(dim=0)  # [s, b]: the first rank holding the max
    local = torch.stack(all_where).gather(0, winner.unsqueeze(0)).squeeze(0)
    return winner * logits.size(-1) + local

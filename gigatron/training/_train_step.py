"""One training iteration and one evaluation pass, as `megatron.training.training` has them.

`train_step` runs forward/backward over all microbatches through the pipeline schedule, checks
gradients for NaN/Inf on every rank and steps the optimizer and the scheduler; `evaluate` runs
forward-only iterations. Re-exported by `gigatron.training.training`.

The NaN/Inf check costs nothing extra when clipping is on: the global grad norm the optimizer
computes for clipping is NaN/Inf exactly when some gradient is (or when its sum of squares
overflows fp32), so `optimizer.step(check_grad_norm=True)` skips the update on such a norm and
only then are the grad buffers scanned to name the ranks. Grads left out of the norm (TP
replicas on TP rank > 0, tied copies) still make it NaN (0 x their norm is added). Without
clipping one min/max pass per grad buffer and one all-reduce run before the step. With fp16
dynamic loss scaling the scaler's overflow check is the check: such a step is skipped and
counted, and the scale backs off, as Megatron (which turns its NaN check off there); a NaN /
Inf under a constant loss scale (`--loss-scale`) is a non-finite gradient like any other.

`--sync-free-step` (gigatron addition, opt-in; `OptimizerConfig.sync_free_step`): `step()` makes
no host sync at all; clipping and the skip of a NaN/Inf step happen on the GPU, and
the norm and the skip flag stay device tensors until the loop logs (or saves), when
`materialize_losses` reads them and raises NonFiniteGradientError for a skipped step unless
`--skip-nan-steps`. Differences: the error comes at the next log line, without the ranks; the LR
scheduler steps on such a skipped step too.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.distributed import DistributedDataParallel
from gigatron.core.num_microbatches_calculator import get_num_microbatches
from gigatron.core.optimizer import MegatronOptimizer
from gigatron.core.optimizer.grad_scaler import DynamicGradScaler
from gigatron.training._train_helpers import eval_batch_sizes
from gigatron.training.global_vars import get_args
from gigatron.training.utils import args_by_name, print_rank_0


class NonFiniteGradientError(RuntimeError):
    """A step produced NaN/Inf gradients and the run was not asked to skip such steps."""


# ---------------------------------------------------------------- one step
def _grad_tensors(model) -> list[torch.Tensor]:
    """Every grad of the model chunks: DDP's flat grad buffers (one tensor per buffer) and any
    `.grad` left outside them where a chunk is wrapped, else each param's main_grad / grad."""

    out = []
    for chunk in model:
        if isinstance(chunk, DistributedDataParallel):
            out += [b.grad_data for b in chunk.buffers + chunk.expert_parallel_buffers]
            # and grads outside the buffers (a param frozen when DDP was built, unfrozen later)
            out += [p.grad for p in chunk.parameters() if p.grad is not None]
            continue
        if hasattr(chunk, "local_grads"):  # FSDP: this rank's shards
            out += chunk.local_grads()
            continue
        for p in chunk.parameters():
            g = getattr(p, "main_grad", None)
            g = p.grad if g is None else g
            if g is not None:
                out.append(g)
    return out


def _nonfinite_grad_ranks(model) -> list[int]:
    """Global ranks whose gradients hold NaN/Inf, agreed on every rank (one all-reduce, one
    host sync). One min/max pass per grad buffer: NaN propagates through both, ±Inf shows as
    an extreme, and no per-element temporary is made."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    flags = torch.zeros(dist.get_world_size(), device=device)
    grads = [g for g in _grad_tensors(model) if g.numel()]
    if grads:
        extremes = torch.stack([v.float() for g in grads for v in torch.aminmax(g.detach())])
        flags[dist.get_rank()] = (~torch.isfinite(extremes).all()).to(flags.device, flags.dtype)
    dist.all_reduce(flags)
    return [r for r, f in enumerate(flags.tolist()) if f]


def train_step(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler, config):
    """One iteration: forward/backward over all microbatches, then the update.

    Returns (losses dict on the last stage else {}, skipped_iter, grad_norm, num_zeros, nan_iter).
    """
    from gigatron.core.pipeline_parallel import get_forward_backward_func

    args = get_args()
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses_reduced = get_forward_backward_func()(
        forward_step_func=forward_step_func,
        data_iterator=data_iterator,
        model=model,
        num_microbatches=get_num_microbatches(),
        **args_by_name(args, "seq_length micro_batch_size"),
        decoder_seq_length=args.seq_length,
        forward_only=False,
    )
    update_successful, grad_norm, num_zeros, nan_iter = _optimizer_step(optimizer, model, args)
    deferred = isinstance(nan_iter, torch.Tensor)  # the sync-free step: known on the device only
    if update_successful:
        increment = get_num_microbatches() * args.micro_batch_size * args.data_parallel_size
        opt_param_scheduler.step(increment=increment)
    skipped = nan_iter if deferred else (0 if update_successful else 1)
    if not ps.is_pipeline_last_stage(ignore_virtual=True):
        return {}, skipped, grad_norm, num_zeros, nan_iter
    losses = _reduce_losses(losses_reduced)
    if not deferred and skipped and not nan_iter:  # Megatron: a skipped step, NaN loss: NaN
        nan_iter = int(any(not math.isfinite(float(v)) for v in losses.values()))
    return losses, skipped, grad_norm, num_zeros, nan_iter


def _check_sync_free_skips(optimizer, args) -> None:
    """The flat Adam step keeps its step counts on the host, so under the sync-free step a
    skipped (NaN/Inf) update still advances them; harmless when the run stops at the next log
    line, wrong when `--skip-nan-steps` trains on. Refused by name."""
    opts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    if args.skip_nan_steps and any(getattr(o, "_flat_step", None) is not None for o in opts):
        raise ValueError(
            "--sync-free-step with --skip-nan-steps needs torch's fused Adam: the flat "
            "Adam step (the CUDA default) would count each skipped step in Adam's bias "
            "correction; add --no-flat-adam-step or drop one of the two"
        )


def _nan_check(optimizer, args) -> str:
    """How this step finds a NaN/Inf gradient (module docstring); the same on every rank:
    "device": the sync-free step skips it on the device, read when the loop logs;
    "off": no check (Megatron's --no-check-for-nan-in-loss-and-grad), or fp16's dynamic loss
    scaler, whose overflow check is the check;
    "norm": the clipping norm is the check (`optimizer.step(check_grad_norm=True)`);
    "scan": no norm to read (no clipping): one min/max pass over the grads before the step."""
    if optimizer.config.sync_free_step:
        return "device"
    opts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    dynamic = any(isinstance(getattr(o, "grad_scaler", None), DynamicGradScaler) for o in opts)
    if dynamic or not getattr(args, "check_for_nan_in_loss_and_grad", True):
        return "off"
    if optimizer.config.clip_grad > 0.0 and isinstance(optimizer, MegatronOptimizer):
        return "norm"
    return "scan"


def _optimizer_step(optimizer, model, args):
    """optimizer.step() behind the NaN/Inf gradient check (`_nan_check`).

    Returns (update_successful, grad_norm, num_zeros, nan_iter); raises NonFiniteGradientError
    on a non-finite gradient unless `--skip-nan-steps`. Every rank takes the same branch: the
    norm and the flags are reduced over all of them."""
    check = _nan_check(optimizer, args)
    it = args.iteration + 1
    if check == "device":
        _check_sync_free_skips(optimizer, args)
    elif check == "scan":
        bad_ranks = _nonfinite_grad_ranks(model)
        if bad_ranks:
            return _nonfinite_step(
                args, f"non-finite gradient at iteration {it} on ranks {bad_ranks}"
            )
    # Megatron's plain call unless the norm is the check (torch-like optimizers work too)
    step_kwargs = {"check_grad_norm": True} if check == "norm" else {}
    update_successful, grad_norm, num_zeros = optimizer.step(**step_kwargs)
    if check == "device":  # applied unless NaN/Inf: known on the device only
        return True, grad_norm, None, ~update_successful
    if update_successful or check != "norm":
        return update_successful, grad_norm, num_zeros, 0
    # not updated: a NaN/Inf norm, or (constant loss scale) the scaler found NaN/Inf
    return _nonfinite_step(args, _norm_check_message(model, it, grad_norm))


def _norm_check_message(model, it: int, grad_norm) -> str:
    """What the norm check found; the grads are scanned only now, to name the ranks."""
    bad_ranks = _nonfinite_grad_ranks(model)
    if bad_ranks:
        message = f"non-finite gradient at iteration {it} on ranks {bad_ranks}"
        return message + ("" if grad_norm is None else f" (grad norm {grad_norm})")
    if grad_norm is None:
        return f"non-finite gradient at iteration {it} (found by the loss scaler's check)"
    return (
        f"non-finite grad norm {grad_norm} at iteration {it}: no NaN/Inf gradient "
        "element, the sum of squares of the gradients overflowed fp32"
    )


def _nonfinite_step(args, message: str):
    """Stop the run on a non-finite gradient, or (--skip-nan-steps) report the skipped step."""
    if not args.skip_nan_steps:
        raise NonFiniteGradientError(message + " (pass --skip-nan-steps to skip such steps)")
    print_rank_0(f"WARNING: {message}; skipping the update on every rank")
    return False, None, None, 1


def _reduce_losses(losses_reduced: list[dict]) -> dict[str, torch.Tensor]:
    """[sum, count] report pairs are summed over microbatches and DP×CP, then divided. Values are
    0-dim device tensors, as Megatron's train_step returns them: reading them (`float()`) waits
    for the step, so the loop reads them only when it logs (`materialize_losses`)."""
    out = {}
    if not losses_reduced:
        return out
    for key in losses_reduced[0]:
        values = [x[key].detach().float().view(-1) for x in losses_reduced]
        if values[0].numel() == 2:
            total = torch.vstack(values).sum(dim=0)
            dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
            out[key] = total[0] / total[1].clamp(min=1)
        else:
            out[key] = torch.cat(values).mean()
    return out


def materialize_losses(entries: list[dict]) -> None:
    """Replace the device tensors of `entries` (history entries, in place: losses, and with the
    sync-free step the grad norm and the skipped / NaN flags) by Python numbers with one host
    sync for all of them; then raise NonFiniteGradientError for a step the sync-free step
    skipped, unless `--skip-nan-steps`."""
    slots = [  # (dict, key, a count?)
        (entry["losses"], key, False)
        for entry in entries
        for key, value in entry["losses"].items()
        if isinstance(value, torch.Tensor)
    ]
    slots += [
        (entry, key, key != "grad_norm")
        for entry in entries
        for key in ("grad_norm", "skipped", "nan")
        if isinstance(entry.get(key), torch.Tensor)
    ]
    if not slots:
        return
    deferred = [e for e in entries if isinstance(e.get("nan"), torch.Tensor)]
    values = torch.stack([where[key].detach().float().reshape(()) for where, key, _ in slots])
    for (where, key, count), value in zip(slots, values.tolist(), strict=True):
        where[key] = int(value) if count else value
    bad = [e["iteration"] for e in deferred if e["nan"]]
    if bad and not get_args().skip_nan_steps:
        raise NonFiniteGradientError(
            f"non-finite gradient at iteration {bad[0]} (--sync-free-step: its update "
            f"was skipped on the GPU, found when the loop read the norms at iteration "
            f"{entries[-1]['iteration']}; NaN/Inf steps: {bad}) (pass --skip-nan-steps to skip "
            "such steps)"
        )


# ---------------------------------------------------------------- evaluation
def evaluate(
    forward_step_func,
    data_iterator,
    model,
    config,
    verbose: bool = False,
    *,
    eval_iters=None,
    full_validation: bool = False,
):
    """Mean losses over `eval_iters` (default `--eval-iters`) forward-only iterations of
    `--eval-global-batch-size` samples each, in microbatches of `--eval-micro-batch-size`
    (both default to the training sizes) (last stage; {} elsewhere).

    `full_validation`: the iterator yields one sample per DP rank per batch
    (MegatronFullValidationSampler); each iteration is one microbatch of one sample."""
    from gigatron.core.pipeline_parallel import get_forward_backward_func

    args = get_args()
    for chunk in model:
        chunk.eval()
    sums: dict[str, torch.Tensor] = {}
    # the full evaluation batch even during a batch-size ramp-up (Megatron's
    # eval_num_microbatches); consumed_valid_samples counts it per iteration
    eval_gbs, eval_mbs = eval_batch_sizes(args)
    if full_validation:
        eval_gbs, eval_mbs = args.data_parallel_size, 1
    num_microbatches = eval_gbs // (eval_mbs * args.data_parallel_size)
    eval_iters = args.eval_iters if eval_iters is None else eval_iters
    with torch.no_grad():
        for _ in range(eval_iters):
            losses = get_forward_backward_func()(
                forward_step_func=forward_step_func,
                data_iterator=data_iterator,
                model=model,
                num_microbatches=num_microbatches,
                seq_length=args.seq_length,
                micro_batch_size=eval_mbs,
                decoder_seq_length=args.seq_length,
                forward_only=True,
            )
            if ps.is_pipeline_last_stage(ignore_virtual=True):
                for report in losses:
                    for key, value in report.items():
                        value = value.detach().float().view(-1)
                        if value.numel() == 1:  # legacy mean-per-microbatch reports
                            value = torch.cat([value, torch.ones(1)])
                        sums[key] = sums.get(key, torch.zeros(2)) + value.cpu()
            args.consumed_valid_samples += eval_gbs
    for chunk in model:
        chunk.train()
    out = {}
    for key, total in sums.items():
        total = total.to("cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=True))
        out[key] = (total[0] / total[1].clamp(min=1)).item()
    return out

"""Cross entropy over vocabulary-parallel logits, without gathering the logits.

Mirrors `megatron.core.tensor_parallel.cross_entropy.vocab_parallel_cross_entropy` (algorithm of
the Megatron-LM paper): all-reduce the row max, each rank looks up the target logit if it owns
the target, then one all-reduce sums the target logits and the partial sums of exp.

Differences from Megatron, on purpose:
- The caller's logits are never modified (Megatron subtracts the max and exponentiates fp32
  logits in place).
- Label smoothing uses Megatron's formula, loss = (1 - s) * nll - s * mean_j log p_j with
  s = alpha * V / (V - 1), but with V the *global* vocabulary and the mean over the whole
  vocabulary. At TP=1 this is exactly Megatron's result (and F.cross_entropy with
  label_smoothing=s); Megatron at TP>1 uses the local shard size and mean, which makes the loss
  depend on the TP size and differ between TP ranks.
- The target logit and the sum of exp (and the smoothing sum) travel in one all-reduce instead
  of two: 2 all-reduces in forward, none in backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gigatron.core.tensor_parallel.utils import VocabUtility
from gigatron.core.utils import (
    get_tensor_model_parallel_group_if_none,
    group_rank,
    group_size,
)

__all__ = ["vocab_parallel_cross_entropy"]


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token loss from vocabulary-split logits.

    forward:  logits [s, b, V/tp], target [s, b] -> all-reduce MAX, all-reduce SUM -> loss [s, b]
    backward: grad [s, b] -> (softmax - onehot(target) smoothed) * grad -> [s, b, V/tp] (no comm)
    """

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, label_smoothing, tp_group):
        tp_size, tp_rank = group_size(tp_group), group_rank(tp_group)
        logits = vocab_parallel_logits.float()  # aliases fp32 input: only read below
        vocab_per_rank = logits.size(-1)
        vocab_size = vocab_per_rank * tp_size

        logits_max = logits.max(dim=-1)[0]  # [s, b]
        if tp_size > 1:
            dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp_group)
        shifted = logits - logits_max.unsqueeze(-1)  # [s, b, V/tp], a new tensor

        start, end = VocabUtility.vocab_range_from_per_partition_vocab_size(
            vocab_per_rank, tp_rank, tp_size
        )
        target_mask = (target < start) | (target >= end)  # not owned by this rank
        masked_target = (target - start).masked_fill(target_mask, 0)
        predicted = shifted.gather(-1, masked_target.unsqueeze(-1)).squeeze(-1)
        predicted = predicted.masked_fill(target_mask, 0.0)  # [s, b]

        stats = [predicted]
        if label_smoothing > 0.0:
            stats.append(shifted.sum(dim=-1))  # sum_j (z_j - max) over this shard
        exp_logits = shifted.exp_()
        stats.append(exp_logits.sum(dim=-1))
        stats = torch.stack(stats, dim=-1)  # [s, b, 2 or 3]
        if tp_size > 1:
            dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=tp_group)
        predicted, sum_exp = stats[..., 0], stats[..., -1]

        log_sum_exp = torch.log(sum_exp)
        loss = log_sum_exp - predicted  # [s, b]
        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))  # [s, b, V/tp]

        smoothing = 0.0
        if label_smoothing > 0.0:
            smoothing = label_smoothing * vocab_size / (vocab_size - 1)
            mean_log_probs = stats[..., 1] / vocab_size - log_sum_exp
            loss = (1.0 - smoothing) * loss - smoothing * mean_log_probs

        ctx.smoothing, ctx.vocab_size = smoothing, vocab_size
        ctx.logits_dtype = vocab_parallel_logits.dtype
        ctx.save_for_backward(softmax, target_mask, masked_target)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target = ctx.saved_tensors
        smoothing = ctx.smoothing
        # d loss / d z_j = p_j - (1 - s) [j == target] - s / V
        grad = softmax - smoothing / ctx.vocab_size if smoothing else softmax.clone()
        owned = (~target_mask).to(grad.dtype) * (1.0 - smoothing)  # [s, b]
        grad.scatter_add_(-1, masked_target.unsqueeze(-1), -owned.unsqueeze(-1))
        grad.mul_(grad_output.unsqueeze(-1))
        return grad.to(ctx.logits_dtype), None, None, None


def vocab_parallel_cross_entropy(
    vocab_parallel_logits: torch.Tensor,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    tp_group=None,
) -> torch.Tensor:
    """Unreduced fp32 loss `[s, b]` from logits `[s, b, V/tp]` split over `tp_group`.

    `target` `[s, b]` holds global vocabulary ids. No ignore-index, no reduction (as Megatron).
    The logits are left untouched. `tp_group=None` means parallel_state's TP group.
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing ({label_smoothing}) must be in [0, 1)")
    if tuple(target.shape) != tuple(vocab_parallel_logits.shape[:-1]):
        raise ValueError(
            f"vocab_parallel_cross_entropy: target shape {tuple(target.shape)} must equal the "
            f"logits shape without the vocab dim {tuple(vocab_parallel_logits.shape[:-1])}"
        )
    tp_group = get_tensor_model_parallel_group_if_none(tp_group)
    if label_smoothing > 0.0 and vocab_parallel_logits.size(-1) * group_size(tp_group) < 2:
        raise ValueError("label smoothing needs a vocabulary of at least 2 entries")
    return _VocabParallelCrossEntropy.apply(
        vocab_parallel_logits, target, label_smoothing, tp_group
    )

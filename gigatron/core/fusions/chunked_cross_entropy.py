"""Output layer + vocab-parallel cross entropy in token chunks: no full-batch fp32 logits.

Fast-path twin of `output_layer` (ColumnParallelLinear, no bias) followed by
`tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels)` as GPTModel computes its
loss (Megatron's `GPTModel.compute_language_model_loss`). gigatron-specific: Megatron's fused
counterparts live in Transformer Engine / Apex, not in megatron.core.

Forward walks the N = s*b tokens in chunks of `chunk_size`: logits_c = x_c W^T (bf16, [c, V/tp]),
per-row max and sum of exp in fp32 (one all-reduce each over TP), loss = lse - z_target, and the
unscaled logit gradient D_c = softmax_c - onehot_c written into one [N, V/tp] buffer in the
logits dtype. The fp32 logits of the whole batch never exist: fp32 appears only per chunk (and
not at all when the elementwise helpers are compiled: they upcast in registers).
Backward applies the per-token incoming gradient g on the narrow side: dX = diag(g) (D W) and
dW = D^T (diag(g) X) (two big matmuls, no pass over D, no recompute of the logits). With
`recompute=True` D is not kept: backward rebuilds it chunk by chunk (one more logits matmul).

With `grad_in_forward=True` (gigatron-only, opt-in) forward also finishes both gradients, so
the logits are multiplied once: per chunk dX_c = D_c W (unscaled) and dW += D_c^T (m_c X_c),
where m is the `loss_weight` (the training loop's loss mask; None = every token 1). Backward
then only scales: dX = diag(g) dX, dW = a dW with a = <g, m> / <m, m>. That is exact only when the
incoming per-token gradient is proportional to m (g = a m: masked sums or means of the per-token
loss, any loss scale or 1/num_tokens factor; Megatron's loss_func): backward checks it without a
host sync (`torch._assert_async`: a RuntimeError on CPU, a device assert on CUDA).

Shapes: N: tokens (s*b), h: hidden, V: vocabulary, tp: tensor-parallel size, c: chunk tokens.
Memory: D costs N*V/tp elements of the logits dtype (bf16: half of the fp32 logits the plain
path keeps for its backward); `recompute=True` keeps only x, W and the fp32 log-sum-exp [N].
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.core import parallel_state
from gigatron.core.tensor_parallel import mappings

_FILE = "gigatron/core/fusions/chunked_cross_entropy.py"

CHUNK_SIZE = 4096  # tokens per chunk by default (GPTModel's); gigatron estimate prices it


def _row_max(logits: Tensor) -> Tensor:
    """[c, V/tp] -> fp32 [c]."""
    return logits.float().amax(dim=-1)


def _row_stats(logits: Tensor, row_max: Tensor, local_target: Tensor, owned: Tensor) -> Tensor:
    """-> fp32 [c, 2]: (z_target - max if this rank owns the target else 0, sum exp(z - max))."""
    shifted = logits.float() - row_max.unsqueeze(-1)
    picked = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
    picked = torch.where(owned, picked, torch.zeros_like(picked))
    return torch.stack((picked, shifted.exp().sum(dim=-1)), dim=-1)


def _logit_grad(logits: Tensor, lse: Tensor, local_target: Tensor, owned: Tensor) -> Tensor:
    """d loss / d logits = softmax - onehot(target), in the logits dtype, [c, V/tp]."""
    probs = (logits.float() - lse.unsqueeze(-1)).exp()
    cols = torch.arange(logits.size(-1), device=logits.device)
    onehot = (cols.unsqueeze(0) == local_target.unsqueeze(-1)) & owned.unsqueeze(-1)
    return (probs - onehot.to(probs.dtype)).to(logits.dtype)


_HELPERS = {"eager": (_row_max, _row_stats, _logit_grad)}


def _helpers(compiled: bool):
    """The three elementwise helpers, torch.compile'd once per process when `compiled`. Inside
    a compiled region the plain ones: they are traced into the enclosing graph either way, and
    filling the cache while tracing would be guarded on, recompiling the whole model once."""
    key = "compiled" if compiled and not torch.compiler.is_compiling() else "eager"
    if key not in _HELPERS:
        _HELPERS[key] = tuple(torch.compile(f, dynamic=False) for f in _HELPERS["eager"])
    return _HELPERS[key]


def _local_targets(target: Tensor, vocab_per_rank: int, tp_group) -> tuple[Tensor, Tensor]:
    """[N] global ids -> (owned [N]: this rank's vocabulary slice holds the id, local id [N])."""
    tp_rank = dist.get_rank(tp_group) if tp_group is not None else 0
    start = tp_rank * vocab_per_rank
    owned = (target >= start) & (target < start + vocab_per_rank)
    return owned, torch.where(owned, target - start, torch.zeros_like(target))


def _chunk_stats(x_c, weight, target_c, owned_c, tp_group, helpers):
    """One chunk's logits [c, V/tp], log-sum-exp [c] and loss [c] (2 all-reduces under TP)."""
    row_max_fn, row_stats_fn, _ = helpers
    logits = torch.matmul(x_c, weight.t())  # [c, V/tp]
    row_max = row_max_fn(logits)  # [c]
    if tp_group is not None:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=tp_group)
    stats = row_stats_fn(logits, row_max, target_c, owned_c)  # [c, 2]
    if tp_group is not None:
        dist.all_reduce(stats, group=tp_group)
    lse = row_max + stats[:, 1].log()  # [c]
    return logits, lse, lse - row_max - stats[:, 0]


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Per-token loss of `x W^T` against global targets, vocabulary split over `tp_group`.

    forward:  x [N, h], W [V/tp, h], target [N] -> per chunk: matmul, all-reduce MAX,
              all-reduce SUM of (z_target, sum exp) -> loss fp32 [N]; keeps D [N, V/tp]
              (with `recompute`: keeps only the log-sum-exp [N])
    backward: grad g [N] -> dX = diag(g) (D W) [N, h] (partial over TP: the caller's mapping
              reduces it), dW = D^T (diag(g) X) [V/tp, h] (no comm). Scaling the [N, h] sides
              instead of D saves a pass over the [N, V/tp] buffer. With `recompute`, D is rebuilt
              chunk by chunk from x, W and the saved log-sum-exp (one more logits matmul).
    """

    @staticmethod
    def forward(ctx, x, weight, target, chunk_size, tp_group, compiled, recompute):
        helpers = _helpers(compiled)
        owned, local_target = _local_targets(target, weight.size(0), tp_group)
        n_tokens = x.size(0)
        loss = torch.empty(n_tokens, dtype=torch.float32, device=x.device)
        lse_all = torch.empty(n_tokens, dtype=torch.float32, device=x.device)
        grad_logits = None
        if not recompute:
            grad_logits = torch.empty(n_tokens, weight.size(0), dtype=x.dtype, device=x.device)
        for lo in range(0, n_tokens, chunk_size):
            hi = min(n_tokens, lo + chunk_size)
            t_c, o_c = local_target[lo:hi], owned[lo:hi]
            logits, lse, loss_c = _chunk_stats(x[lo:hi], weight, t_c, o_c, tp_group, helpers)
            loss[lo:hi], lse_all[lo:hi] = loss_c, lse
            if not recompute:
                grad_logits[lo:hi] = helpers[2](logits, lse, t_c, o_c)
        ctx.chunk_size, ctx.compiled, ctx.recompute = chunk_size, compiled, recompute
        ctx.save_for_backward(x, weight, grad_logits, lse_all, local_target, owned)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        # a layer weight under gradient_accumulation_fusion takes dW in main_grad (DDP's hook
        # skips its .grad)
        from gigatron.core.tensor_parallel.wgrad import hand_over_weight_grad

        x, weight, grad_logits, lse_all, local_target, owned = ctx.saved_tensors
        g = grad_loss.to(x.dtype).unsqueeze(-1)  # [N, 1]
        if not ctx.recompute:
            grad_x = grad_logits.matmul(weight).mul_(g)  # [N, h]
            grad_weight = grad_logits.t().matmul(x * g)  # [V/tp, h]
            return grad_x, hand_over_weight_grad(weight, grad_weight), None, None, None, None, None
        logit_grad_fn = _helpers(ctx.compiled)[2]
        grad_x = torch.empty_like(x)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for lo in range(0, x.size(0), ctx.chunk_size):
            hi = min(x.size(0), lo + ctx.chunk_size)
            logits = torch.matmul(x[lo:hi], weight.t())  # [c, V/tp], recomputed
            d = logit_grad_fn(logits, lse_all[lo:hi], local_target[lo:hi], owned[lo:hi])
            grad_x[lo:hi] = d.matmul(weight).mul_(g[lo:hi])
            grad_weight.add_(d.t().matmul(x[lo:hi] * g[lo:hi]))
        grad_weight = hand_over_weight_grad(weight, grad_weight)  # fp32 sum, straight to main_grad
        return grad_x, grad_weight.to(weight.dtype), None, None, None, None, None


class _ChunkedLinearCrossEntropyGradInForward(torch.autograd.Function):
    """`_ChunkedLinearCrossEntropy` whose forward also computes the gradients (one logits matmul
    per chunk in all; see the module docstring for the contract on the incoming gradient).

    forward:  x [N, h], W [V/tp, h], target [N], loss_weight fp32 [N] or None -> loss fp32 [N];
              keeps dX_u [N, h] (x dtype, partial over TP) and dW_u fp32 [V/tp, h]
    backward: grad g [N] -> dX = diag(g) dX_u, dW = a dW_u, a = <g, m> / <m, m>
    """

    @staticmethod
    def forward(ctx, x, weight, target, loss_weight, chunk_size, tp_group, compiled, need):
        # need: (dX wanted, dW wanted), decided by the caller (grad mode and requires_grad)
        helpers = _helpers(compiled)
        owned, local_target = _local_targets(target, weight.size(0), tp_group)
        n_tokens = x.size(0)
        loss = torch.empty(n_tokens, dtype=torch.float32, device=x.device)
        need_x, need_w = need
        grad_x = grad_weight = None
        if need_x:
            grad_x = torch.empty_like(x)  # [N, h], rows not yet scaled by g
        if need_w:
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for lo in range(0, n_tokens, chunk_size):
            hi = min(n_tokens, lo + chunk_size)
            t_c, o_c = local_target[lo:hi], owned[lo:hi]
            logits, lse, loss_c = _chunk_stats(x[lo:hi], weight, t_c, o_c, tp_group, helpers)
            loss[lo:hi] = loss_c
            if need_x or need_w:
                d = helpers[2](logits, lse, t_c, o_c)  # [c, V/tp]
                del logits
                if need_x:
                    grad_x[lo:hi] = d.matmul(weight)
                if need_w:
                    x_c = x[lo:hi]
                    if loss_weight is not None:
                        x_c = x_c * loss_weight[lo:hi].unsqueeze(-1).to(x.dtype)
                    grad_weight.add_(d.t().matmul(x_c))
        ctx.has_weight, ctx.need = loss_weight is not None, need
        ctx.save_for_backward(weight, grad_x, grad_weight, loss_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        from gigatron.core.tensor_parallel.wgrad import hand_over_weight_grad

        weight, grad_x, grad_weight, loss_weight = ctx.saved_tensors
        if not any(ctx.need):
            raise RuntimeError(
                "chunked cross entropy with grad_in_forward=True ran its forward without grad "
                f"(torch.no_grad or inputs not requiring grad) but got a backward ({_FILE})"
            )
        g = grad_loss.float()  # [N]
        m = loss_weight if ctx.has_weight else torch.ones_like(g)
        a = (g * m).sum() / (m * m).sum().clamp_min(torch.finfo(torch.float32).tiny)
        off = (g - a * m).abs().amax()
        torch._assert_async(
            off <= 1e-4 * g.abs().amax(),
            "chunked cross entropy with grad_in_forward=True: the per-token loss gradient must "
            f"be proportional to loss_mask (a masked sum or mean of the loss) ({_FILE})",
        )
        dx = dw = None
        if grad_x is not None:
            dx = grad_x * g.to(grad_x.dtype).unsqueeze(-1)  # [N, h]
        if grad_weight is not None:  # fp32, straight to main_grad
            dw = hand_over_weight_grad(weight, grad_weight * a).to(weight.dtype)
        return dx, dw, None, None, None, None, None, None


def chunked_linear_cross_entropy(
    hidden_states: Tensor,
    weight: Tensor,
    labels: Tensor,
    *,
    chunk_size: int = CHUNK_SIZE,
    sequence_parallel: bool = False,
    tp_group=None,
    compiled: bool | None = None,
    recompute: bool = False,
    grad_in_forward: bool = False,
    loss_mask: Tensor | None = None,
) -> Tensor:
    """Per-token fp32 loss [b, s] of `hidden_states` [s(/tp), b, h] through the output weight.

    `weight` [V/tp, h] is the (vocab-parallel) output-layer or tied embedding weight, `labels`
    [b, s] global vocabulary ids. `sequence_parallel`: `hidden_states` holds this rank's
    sequence slice [s/tp, b, h] (it is all-gathered, its gradient reduce-scattered), as in
    ColumnParallelLinear. `tp_group=None` means parallel_state's TP group (or none when
    parallel_state is not initialized). `compiled=None` compiles the elementwise helpers on CUDA.
    `recompute=True` keeps no [N, V/tp] buffer between forward and backward (the logits are
    recomputed chunk by chunk in backward: one more logits matmul, less peak memory).
    `grad_in_forward=True`: forward also computes both gradients (no logits matmul in
    backward; needs the incoming gradient proportional to `loss_mask` [b, s], None = all ones;
    module docstring). Same result as GPTModel's output_layer + vocab_parallel_cross_entropy
    (no label smoothing).
    """

    if chunk_size <= 0:
        raise ValueError(f"chunk_size ({chunk_size}) must be positive ({_FILE})")
    if tp_group is None and parallel_state.model_parallel_is_initialized():
        tp_group = parallel_state.get_tensor_model_parallel_group()
    tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    s_local, b, h = hidden_states.shape
    if tuple(labels.shape) != (b, s_local * (tp_size if sequence_parallel else 1)):
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must be [b, s] = "
            f"({b}, {s_local * (tp_size if sequence_parallel else 1)}) ({_FILE})"
        )
    if loss_mask is not None and tuple(loss_mask.shape) != tuple(labels.shape):
        raise ValueError(
            f"loss_mask shape {tuple(loss_mask.shape)} must equal labels shape "
            f"{tuple(labels.shape)} ({_FILE})"
        )
    if weight.size(-1) != h:
        raise ValueError(f"weight shape {tuple(weight.shape)} must be [V/tp, {h}] ({_FILE})")
    if tp_size > 1:
        if sequence_parallel:
            hidden_states = mappings.gather_from_sequence_parallel_region(
                hidden_states, group=tp_group
            )
        else:
            hidden_states = mappings.copy_to_tensor_model_parallel_region(
                hidden_states, group=tp_group
            )
    else:
        tp_group = None
    if compiled is None:
        compiled = hidden_states.is_cuda
    s = hidden_states.size(0)
    x = hidden_states.reshape(s * b, h)  # [N, h], token n = i*b + j for (seq i, batch j)
    target = labels.transpose(0, 1).reshape(s * b)  # [N] in the same order
    if grad_in_forward:
        grad_on = torch.is_grad_enabled()
        need_grad = (grad_on and x.requires_grad, grad_on and weight.requires_grad)
        weights = None
        if loss_mask is not None:
            weights = loss_mask.transpose(0, 1).reshape(s * b).float()  # [N], token order of x
        loss = _ChunkedLinearCrossEntropyGradInForward.apply(
            x, weight, target, weights, chunk_size, tp_group, compiled, need_grad
        )
    else:
        loss = _ChunkedLinearCrossEntropy.apply(
            x, weight, target, chunk_size, tp_group, compiled, recompute
        )
    return loss.view(s, b).transpose(0, 1).contiguous()  # [b, s]

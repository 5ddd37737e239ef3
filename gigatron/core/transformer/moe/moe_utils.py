"""MoE math shared by the router, dispatchers and experts.

Mirrors `megatron.core.transformer.moe.moe_utils`: the Switch/GShard load-balancing loss
(arXiv:2101.03961), the ST-MoE router z-loss (arXiv:2202.08906), `MoEAuxLossAutoScaler` (aux
losses ride on an activation and inject their gradient in backward), top-k routing with softmax
or sigmoid scores (optionally group-limited, DeepSeek-V2/V3), capacity-based token dropping,
token permutation by expert, and the aux-loss-free expert-bias update (arXiv:2408.15664).
Per-layer aux-loss tracking lives in `_tracker.py` and is re-exported here.

Shapes: T: tokens on this rank, E: experts, k: top-k, N: routed (token, expert) pairs, h: hidden.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.core.process_groups_config import ProcessGroupCollection
from gigatron.core.transformer.moe._tracker import (  # noqa: F401  (public re-exports)
    clear_aux_losses_tracker,
    get_moe_layer_wise_logging_tracker,
    prepare_aux_losses_tracker,
    reduce_aux_losses_tracker_across_ranks,
    save_to_aux_losses_tracker,
    track_moe_metrics,
)


# ---------------------------------------------------------------- losses
def switch_load_balancing_loss_func(
    probs: Tensor,
    tokens_per_expert: Tensor,
    total_num_tokens: int,
    topk: int,
    num_experts: int,
    moe_aux_loss_coeff: float,
    fused: bool = False,
    padding_mask: Tensor | None = None,
) -> Tensor:
    """`E * coeff / (k * T^2) * sum_e (sum_t probs[t, e]) * tokens_per_expert[e]`.

    probs [T_local, E] are this rank's scores; tokens_per_expert [E] and total_num_tokens are
    counted over the whole (TP x CP) group, so the per-rank losses sum to the group's loss.
    """
    if fused:
        raise ValueError("switch_load_balancing_loss_func: fused=True needs Transformer Engine")
    if padding_mask is not None:
        probs = probs * padding_mask.unsqueeze(-1)
    scale = num_experts * moe_aux_loss_coeff / (topk * total_num_tokens * total_num_tokens)
    return torch.sum(probs.sum(dim=0) * tokens_per_expert) * scale


def z_loss_func(logits: Tensor, z_loss_coeff: float, padding_mask: Tensor | None = None) -> Tensor:
    """`coeff * mean_t(logsumexp(logits[t])^2)`; padding_mask [T] True = padding (excluded)."""
    z = torch.square(torch.logsumexp(logits, dim=-1))  # [T]
    if padding_mask is None:
        return z.mean() * z_loss_coeff
    valid = ~padding_mask
    return (z * valid).sum() / torch.clamp(valid.sum(), min=1.0) * z_loss_coeff


# The tensor behind MoEAuxLossAutoScaler.main_loss_backward_scale, where the backward reads it: a
# module global (dynamo lifts it into a compiled graph; it cannot trace a tensor read from the
# autograd.Function's class). Changed in place once it exists. Under torch.compile the d(aux)
# computation may run in the compiled forward (it does not depend on the output grad), so the
# schedules set the scale before each forward (gigatron/core/pipeline_parallel/_steps.py).
_BACKWARD_SCALE: dict[str, Tensor] = {}


class RandomSTE(torch.autograd.Function):
    """Random logits for forced load balancing (`moe_router_force_load_balancing`).

    forward:  logits [T, E] -> standard normal [T, E] from the expert-parallel RNG stream
    backward: grad [T, E]   -> the same grad (straight-through)
    """

    @staticmethod
    def forward(ctx, logits: Tensor) -> Tensor:
        from gigatron.core.tensor_parallel.random import (
            get_cuda_rng_tracker,
            get_expert_parallel_rng_tracker_name,
        )

        with get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name()):
            return logits.clone().normal_()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


def apply_random_logits(logits: Tensor) -> Tensor:
    """[T, E] logits -> random [T, E] logits with a straight-through gradient (Megatron's)."""
    return RandomSTE.apply(logits)


class MoEAuxLossAutoScaler(torch.autograd.Function):
    """Attach an aux loss to an activation: identity forward; backward adds d(aux) = scale.

    `scale` is the main loss's backward scale (loss scale / num_microbatches), set by the
    pipeline schedules through `set_loss_scale` before each microbatch's forward (Megatron: after
    it), so aux losses are scaled like the loss. Set it through `set_loss_scale`: the backward
    reads the tensor `set_loss_scale` keeps (also `main_loss_backward_scale`), not the class
    attribute, and 1.0 before any was set.
    """

    main_loss_backward_scale: Tensor | None = None

    @staticmethod
    def forward(ctx, output: Tensor, aux_loss: Tensor) -> Tensor:
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        (aux_loss,) = ctx.saved_tensors
        scale = _BACKWARD_SCALE.get("scale")
        if scale is None:
            return grad_output, torch.ones_like(aux_loss)
        return grad_output, torch.ones_like(aux_loss) * scale.to(aux_loss.device)

    @staticmethod
    def set_loss_scale(scale: Tensor) -> None:
        """Set the scale of the aux-loss gradients (must match the main loss's scaling)."""
        scale = scale.detach().reshape(()) if torch.is_tensor(scale) else torch.tensor(scale)
        scale = scale.float()
        current = _BACKWARD_SCALE.get("scale")
        if current is None or current.device != scale.device:
            current = scale.clone()
            _BACKWARD_SCALE["scale"] = current
        else:
            current.copy_(scale)
        MoEAuxLossAutoScaler.main_loss_backward_scale = current


# ---------------------------------------------------------------- routing
def group_limited_topk(
    scores: Tensor, topk: int, num_tokens: int, num_experts: int, num_groups: int, group_topk: int
) -> tuple[Tensor, Tensor]:
    """Pick `group_topk` of `num_groups` expert groups per token (by the sum of each group's
    top `topk/group_topk` scores), then the top-k experts inside them.

    Returns (probs, indices), both [T, k]."""
    per_group = scores.view(num_tokens, num_groups, -1)  # [T, G, E/G]
    group_scores = per_group.topk(topk // group_topk, dim=-1)[0].sum(dim=-1)  # [T, G]
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand_as(per_group).reshape(num_tokens, num_experts)
    masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(masked, k=topk, dim=-1)


def topk_routing_with_score_function(
    logits: Tensor,
    topk: int,
    use_pre_softmax: bool = False,
    num_groups: int | None = None,
    group_topk: int | None = None,
    scaling_factor: float | None = None,
    score_function: str = "softmax",
    expert_bias: Tensor | None = None,
    fused: bool = False,
) -> tuple[Tensor, Tensor]:
    """logits [T, E] -> (routing probs [T, E] (zero off the top-k), routing_map [T, E] bool).

    softmax: top-k of the logits then softmax over the k (default), or softmax over all E then
    top-k (`use_pre_softmax`). sigmoid: top-k of sigmoid scores (+ `expert_bias` for the choice
    only), normalised over the k when k > 1.
    """
    if fused:
        raise ValueError("topk_routing_with_score_function: fused=True needs Transformer Engine")
    num_tokens, num_experts = logits.shape

    def _topk(scores):
        if group_topk:
            return group_limited_topk(scores, topk, num_tokens, num_experts, num_groups, group_topk)
        return torch.topk(scores, k=topk, dim=1)

    if score_function == "softmax":
        if use_pre_softmax:
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32).type_as(logits)
            probs, top_idx = _topk(scores)
        else:
            top_logits, top_idx = _topk(logits)
            probs = torch.softmax(top_logits, dim=-1, dtype=torch.float32).type_as(logits)
    elif score_function == "sigmoid":
        scores = torch.sigmoid(logits.float()).type_as(logits)
        if expert_bias is not None:
            _, top_idx = _topk(scores + expert_bias)
            top_scores = torch.gather(scores, dim=1, index=top_idx)
        else:
            top_scores, top_idx = _topk(scores)
        probs = (
            top_scores / (top_scores.sum(dim=-1, keepdim=True) + 1e-20)
            if topk > 1
            else (top_scores)
        )
    else:
        raise ValueError(
            f"moe_router_score_function ({score_function!r}) must be 'softmax' or 'sigmoid'"
        )
    if scaling_factor:
        probs = probs * scaling_factor
    routing_probs = torch.zeros_like(logits).scatter(1, top_idx, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top_idx, True)
    return routing_probs, routing_map


def compute_routing_scores_for_aux_loss(
    logits: Tensor, topk: int, score_function: str, padding_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Unbiased, undropped top-k map and full score distribution [T, E] for the aux losses."""
    if score_function == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits)
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    top_idx = torch.topk(scores, k=topk, dim=1)[1]
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top_idx, True)
    if padding_mask is not None:
        valid = (~padding_mask).unsqueeze(-1)
        routing_map, scores = routing_map & valid, scores * valid
    return routing_map, scores


def get_capacity(
    num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int | None = None
) -> int:
    """Per-expert capacity `ceil(num_tokens / num_experts * capacity_factor)`."""
    capacity = math.ceil((num_tokens / num_experts) * capacity_factor)
    return max(capacity, min_capacity) if min_capacity is not None else capacity


def apply_router_token_dropping(
    routing_probs: Tensor,
    routing_map: Tensor,
    router_topk: int,
    capacity_factor: float,
    drop_policy: str = "probs",
    pad_to_capacity: bool = False,
) -> tuple[Tensor, Tensor]:
    """Keep at most `ceil(T * k / E * capacity_factor)` tokens per expert.

    "probs" keeps the highest-probability tokens, "position" the earliest ones. With
    `pad_to_capacity` every expert gets exactly `capacity` slots (unrouted fillers get prob 0).
    """
    num_tokens, num_experts = routing_probs.shape
    capacity = get_capacity(num_tokens * router_topk, num_experts, capacity_factor)
    if capacity >= num_tokens:
        keep = torch.ones_like(routing_map)
    elif drop_policy == "probs":
        idx = torch.topk(routing_probs, k=capacity, dim=0, sorted=False)[1]
        keep = torch.zeros_like(routing_map).scatter(0, idx, True)
    elif drop_policy == "position":
        # rank of each routed token inside its expert's queue, in token order
        position = torch.cumsum(routing_map.int(), dim=0)
        keep = routing_map & (position <= capacity)
        if pad_to_capacity:  # fill the rest of the queue with the earliest unrouted tokens
            fill = torch.cumsum((~routing_map).int(), dim=0)
            need = (capacity - keep.sum(dim=0)).clamp(min=0)
            keep = keep | (~routing_map & (fill <= need))
    else:
        raise ValueError(f"moe_token_drop_policy ({drop_policy!r}) must be 'probs' or 'position'")
    final_map = keep if pad_to_capacity else routing_map & keep
    return routing_probs * final_map, final_map


# ---------------------------------------------------------------- permutation
def permute(
    tokens: Tensor,
    routing_map: Tensor,
    probs: Tensor | None = None,
    num_out_tokens: int | None = None,
    fused: bool = False,
    drop_and_pad: bool = False,
):
    """Group tokens by expert: tokens [T, h], routing_map [T, E] ->
    (permuted [N, h] expert-major, token order inside an expert; permuted probs [N] or None;
    sorted_indices [N]: the source token of each row). `num_out_tokens` / `drop_and_pad` are
    Megatron's buffer-size hints and change nothing here (dropping is already in the map)."""
    if fused:
        raise ValueError("permute: fused=True needs Transformer Engine kernels")
    expert_major = routing_map.t()  # [E, T]
    sorted_indices = expert_major.nonzero(as_tuple=True)[1]  # [N]
    permuted = tokens.index_select(0, sorted_indices)
    permuted_probs = None if probs is None else probs.t()[expert_major]  # [N]
    return permuted, permuted_probs, sorted_indices


def unpermute(
    permuted_tokens: Tensor,
    sorted_indices: Tensor,
    restore_shape,
    probs: Tensor | None = None,
    routing_map: Tensor | None = None,
    fused: bool = False,
    drop_and_pad: bool = False,
) -> Tensor:
    """Inverse of `permute`: sum the rows back onto their source tokens -> [T, h].

    With `probs` [T, E] and `routing_map`, each row is first weighted by its token's prob for
    its expert (for experts that did not apply the probs themselves)."""
    if fused:
        raise ValueError("unpermute: fused=True needs Transformer Engine kernels")
    if probs is not None:
        if routing_map is None:
            raise ValueError("unpermute: probs needs the routing_map it was permuted with")
        weights = probs.t()[routing_map.t()].unsqueeze(-1)  # [N, 1]
        permuted_tokens = permuted_tokens * weights.to(permuted_tokens.dtype)
    out = permuted_tokens.new_zeros(restore_shape)
    return out.index_add(0, sorted_indices, permuted_tokens)


class _RowsByExpert(torch.autograd.Function):
    """Copy each token to its k rows in expert order (gathers both ways, no atomic adds).

    forward:  x [T, h] -> x[source] [T*k, h]          (source = token of each permuted row)
    backward: g [T*k, h] -> g[restore].view(T, k, h).sum(1) [T, h]
    """

    @staticmethod
    def forward(ctx, x: Tensor, source: Tensor, restore: Tensor, topk: int) -> Tensor:
        ctx.save_for_backward(source, restore)
        ctx.topk = topk
        return x.index_select(0, source)

    @staticmethod
    def backward(ctx, grad: Tensor):
        source, restore = ctx.saved_tensors
        return _sum_token_rows(grad, restore, ctx.topk), None, None, None


class _TokensFromRows(torch.autograd.Function):
    """Sum each token's k expert rows back onto it (the inverse of `_RowsByExpert`).

    forward:  y [T*k, h] -> y[restore].view(T, k, h).sum(1) [T, h]
    backward: g [T, h] -> g[source] [T*k, h]
    """

    @staticmethod
    def forward(ctx, y: Tensor, source: Tensor, restore: Tensor, topk: int) -> Tensor:
        ctx.save_for_backward(source, restore)
        return _sum_token_rows(y, restore, topk)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (source, _) = ctx.saved_tensors
        return grad.index_select(0, source), None, None, None


def _sum_token_rows(rows: Tensor, restore: Tensor, topk: int) -> Tensor:
    """rows [T*k, h] in expert order -> [T, h]: each token's k rows (token-major) summed."""
    return rows.index_select(0, restore).view(-1, topk, rows.shape[-1]).sum(dim=1)


def permute_dropless(tokens: Tensor, routing_map: Tensor, probs: Tensor, topk: int):
    """`permute` without a host sync: every token has exactly `topk` experts (dropless top-k, no
    capacity), so there are always N = T*k rows (a static shape) and the counts stay on device.

    tokens [T, h], routing_map [T, E] bool (k True per row), probs [T, E] ->
    (permuted [N, h] expert-major, token order inside an expert, as `permute`; permuted probs
    [N]; tokens_per_expert [E] int64 on the tokens' device; (source [N], restore [N]) for
    `unpermute_dropless`). source[r]: the token of row r; restore[t*k + j]: the row holding
    token t's j-th expert (experts ascending)."""
    num_tokens, num_experts = routing_map.shape
    # each token's k experts, ascending: a stable sort puts the True columns first in order
    experts = torch.sort(routing_map.to(torch.uint8), dim=1, descending=True, stable=True)[1]
    experts = experts[:, :topk]  # [T, k]
    slot_probs = probs.gather(1, experts).reshape(-1)  # [N], token-major
    order = torch.sort(experts.reshape(-1), stable=True)[1]  # [N]: token-major slot of row r
    source = torch.div(order, topk, rounding_mode="floor")
    restore = torch.empty_like(order).scatter_(
        0, order, torch.arange(order.numel(), device=order.device)
    )
    permuted = _RowsByExpert.apply(tokens, source, restore, topk)
    tokens_per_expert = routing_map.sum(dim=0)
    return permuted, slot_probs.index_select(0, order), tokens_per_expert, (source, restore)


def unpermute_dropless(rows: Tensor, indices: tuple[Tensor, Tensor], topk: int) -> Tensor:
    """Inverse of `permute_dropless`: rows [N, h] -> [T, h], the sum of each token's k rows."""
    source, restore = indices
    return _TokensFromRows.apply(rows, source, restore, topk)


def sort_chunks_by_idxs(x: Tensor, split_sizes: list[int], sorted_idxs: list[int]) -> Tensor:
    """Split dim 0 into `split_sizes` chunks and concatenate them in `sorted_idxs` order."""
    chunks = torch.split(x, split_sizes, dim=0)
    return torch.cat([chunks[i] for i in sorted_idxs], dim=0)


# ---------------------------------------------------------------- expert bias (aux-loss-free)
def get_updated_expert_bias(
    tokens_per_expert: Tensor, expert_bias: Tensor, expert_bias_update_rate: float, group=None
) -> Tensor:
    """bias + rate * sign(mean_count - count): under-loaded experts become more attractive.

    Counts [..., E] are summed over `group` (default: parallel_state's TP x DP x CP group).
    """
    with torch.no_grad():
        if dist.is_initialized():
            if group is None:
                from gigatron.core import parallel_state

                group = parallel_state.get_tensor_and_data_parallel_group(
                    with_context_parallel=True
                )
            dist.all_reduce(tokens_per_expert, group=group)
        average = tokens_per_expert.sum(dim=-1, keepdim=True) / tokens_per_expert.shape[-1]
        return expert_bias + torch.sign(average - tokens_per_expert) * expert_bias_update_rate


def update_router_expert_bias(model: list, config, group=None) -> None:
    """Apply one expert-bias step to every router of `model` (list of chunks), reset counts.

    Megatron runs this inside `finalize_model_grads` when `moe_router_enable_expert_bias`.
    """
    routers = [
        m for chunk in model for m in chunk.modules() if getattr(m, "expert_bias", None) is not None
    ]
    if not routers:
        return
    counts = torch.stack([r.local_tokens_per_expert for r in routers])  # [R, E]
    biases = torch.stack([r.expert_bias for r in routers])
    updated = get_updated_expert_bias(counts, biases, config.moe_router_bias_update_rate, group)
    for router, new_bias in zip(routers, updated):
        router.local_tokens_per_expert.zero_()
        router.expert_bias.copy_(new_bias)


# ---------------------------------------------------------------- layer pattern
def get_moe_layer_pattern(config) -> list[int]:
    """`moe_layer_freq` -> per-layer 0/1 list (1 = MoE): int k means layers 0, k, 2k, ..."""
    freq, n = config.moe_layer_freq, config.num_layers
    if isinstance(freq, int):
        if freq <= 0:
            raise ValueError(f"moe_layer_freq ({freq}) must be a positive int or a 0/1 list")
        return [1 if i % freq == 0 else 0 for i in range(n)]
    pattern = list(freq)
    if len(pattern) != n or any(v not in (0, 1) for v in pattern):
        raise ValueError(
            f"moe_layer_freq ({pattern}) must be a list of {n} (num_layers) zeros and ones"
        )
    return pattern


def get_default_pg_collection():
    """parallel_state's groups used by MoE layers, as a ProcessGroupCollection."""

    return ProcessGroupCollection.use_mpu_process_groups(
        ["tp", "cp", "tp_cp", "ep", "expt_tp", "tp_ep", "expt_dp", "tp_dp_cp", "dp", "pp"]
    )

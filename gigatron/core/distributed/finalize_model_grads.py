"""Everything that must happen to grads between the last backward and `optimizer.step()`;
mirrors `megatron.core.distributed.finalize_model_grads`.

1. finish the DP (x CP) grad reduction of every model chunk (DDP `finish_grad_sync`);
2. all-reduce (sum) over TP the grads of params replicated across TP ranks but fed different
   sequence shards (`param.sequence_parallel = True`: layer norms, RowParallel biases, routers)
   - each TP rank only saw its s/tp tokens - and, with `qk_layernorm`, of q/k layernorm weights
   (each TP rank applies them to its own heads); average those marked
   `average_gradients_across_tp_domain`;
3. all-reduce the tied word-embedding grad between the first and the last PP stage (embedding
   group), so both copies take the same step - also an untied one that two stages both embed
   with (T5's encoder/decoder split flags those copies `shared_embedding`);
   then the learned position-embedding grad over the position-embedding group
   (`get_position_embedding_ranks`; by default the first stage only, so nothing happens; T5's
   split adds the decoder's first stage);
4. with `num_tokens` (per-token loss): broadcast the token count from the last PP stage, sum it
   over DP x CP and divide all grads by it.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from gigatron.core import parallel_state as ps
from gigatron.core.utils import get_attr_wrapped_model, get_model_config

logger = logging.getLogger(__name__)


def _main_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """Where the grad lives: `main_grad` under DDP, else `.grad` (under FSDP this rank's shard
    of it: TP ranks hold the same DP shard of a replicated param, so they reduce shard-wise)."""
    grad = param.main_grad if hasattr(param, "main_grad") else param.grad
    return grad.to_local() if isinstance(grad, DTensor) else grad


def _all_reduce_coalesced(grads: list[torch.Tensor], group) -> None:
    """Sum `grads` over `group` in one collective per dtype (flatten, reduce, copy back)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in same:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def _allreduce_non_tensor_model_parallel_grads(model: list, config, tp_group) -> None:
    """Over TP: sum the grads of SP-marked params (and q/k layernorms, whose replicated weights
    each TP rank applies to its own heads); average those marked
    `average_gradients_across_tp_domain` (step 2 of the module doc)."""
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return
    # A config without the field (a bare module) defers to the param attribute alone.
    sp_on = getattr(config, "sequence_parallel", True)
    qk_on = getattr(config, "qk_layernorm", False)
    to_sum, to_avg = [], []
    for chunk in model:
        for name, param in chunk.named_parameters():
            grad = _main_grad(param)
            if not param.requires_grad or grad is None:
                continue
            if getattr(param, "average_gradients_across_tp_domain", False):
                to_avg.append(grad)
            elif (sp_on and getattr(param, "sequence_parallel", False)) or (
                qk_on and ("q_layernorm" in name or "k_layernorm" in name)
            ):
                to_sum.append(grad)
    if to_sum:
        _all_reduce_coalesced(to_sum, tp_group)
    if to_avg:
        _all_reduce_coalesced(to_avg, tp_group)
        for g in to_avg:
            g.div_(dist.get_world_size(tp_group))


def _embedding_stage_module(model: list, ps):
    """The unwrapped chunk of this rank that holds its embeddings (Megatron's choice: first
    chunk on the first stage, last chunk on the last stage, else the first), or None for a
    module that is not a Megatron-style language model."""
    if ps.is_pipeline_first_stage(ignore_virtual=True):
        chunk = model[0]
    elif ps.is_pipeline_last_stage(ignore_virtual=True):
        chunk = model[-1]
    else:  # e.g. T5's decoder first stage, or a custom embedding-rank layout
        chunk = model[0]
    try:
        return get_attr_wrapped_model(chunk, "pre_process", return_model_obj=True)
    except RuntimeError:
        return None


def _shared_embedding_weight(model: list, ps):
    """(module, weight) of this rank's copy of a weight shared over the embedding group (tied
    word embedding / output weight, or word embeddings two stages both embed with); None where
    nothing is shared: one stage, a rank outside the group, or not a language model."""
    if ps.get_pipeline_model_parallel_world_size() == 1 or not ps.is_rank_in_embedding_group():
        return None
    module = _embedding_stage_module(model, ps)
    if module is None or not hasattr(module, "shared_embedding_or_output_weight"):
        return None  # not a Megatron-style language model: nothing is tied
    weight = module.shared_embedding_or_output_weight()
    tied = getattr(module, "share_embeddings_and_output_weights", False)
    if weight is None or not (tied or getattr(weight, "shared_embedding", False)):
        return None
    return module, weight


def _allreduce_word_embedding_grads(model: list, ps) -> None:
    """Sum the shared word-embedding / output weight grad over the embedding group (first and
    last PP stage by default): tied weights, or word embeddings two stages both embed with."""
    shared = _shared_embedding_weight(model, ps)
    if shared is None:
        return
    _, weight = shared
    grad = _main_grad(weight)
    if grad is None and weight.requires_grad:  # a stage without a grad still joins the sum
        grad = weight.grad = torch.zeros_like(weight)
    if grad is not None:
        dist.all_reduce(grad, group=ps.get_embedding_group())


_TIED_CHECK_STEPS = 3  # training steps after which the copies are compared (then never again)


_TIED_RTOL = 1e-6  # copies summed in another order (NCCL, gloo) differ by rounding only


def _copies_agree(stats: list[torch.Tensor], numel: int) -> bool:
    """Whether each copy's (sum, norm) matches the first copy's up to rounding: relative to the
    norm (the sum's error scales with norm * sqrt(numel), as the sum can be ~0)."""
    first_sum, first_norm = (float(x) for x in stats[0])
    scale = max(abs(first_norm), 1e-30)
    for s in stats[1:]:
        if abs(float(s[1]) - first_norm) > _TIED_RTOL * scale:
            return False
        if abs(float(s[0]) - first_sum) > _TIED_RTOL * scale * max(numel, 1) ** 0.5:
            return False
    return True


def check_tied_embedding_copies(model: list) -> None:
    """Warn (one line) when the copies of a weight shared over the embedding group differ, e.g.
    the first stage's word embedding and the last stage's tied output weight of a hand-built
    loop whose optimizer stepped grads nobody summed. Collective over the embedding group;
    the schedules call it at the start of each of the first training calls, so it compares
    the copies after 1 .. _TIED_CHECK_STEPS optimizer steps, stopping at the first warning.
    Skipped under DDP's overlap_param_gather (parameters are gathered during the forward)."""
    shared = _shared_embedding_weight(model, ps)
    if shared is None:
        return
    module, weight = shared
    if any(getattr(getattr(c, "ddp_config", None), "overlap_param_gather", False) for c in model):
        return
    calls = module.__dict__.get("_tied_copy_checks", 0)
    if calls > _TIED_CHECK_STEPS:
        return
    module.__dict__["_tied_copy_checks"] = calls + 1
    if calls == 0:
        return  # before the first step: the copies start equal (tied at construction)
    group = ps.get_embedding_group()
    data = weight.detach().float()
    stats = torch.stack([data.sum(), torch.linalg.vector_norm(data)]).double()
    gathered = [torch.empty_like(stats) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, stats, group=group)
    if _copies_agree(gathered, data.numel()):
        return
    module.__dict__["_tied_copy_checks"] = _TIED_CHECK_STEPS + 1  # warn once
    ranks = dist.get_process_group_ranks(group)
    first = data.clone()
    dist.broadcast(first, src=ranks[0], group=group)
    diff = float(torch.linalg.vector_norm(data - first))
    diffs = [torch.zeros(1, dtype=torch.float64, device=data.device) for _ in ranks]
    dist.all_gather(diffs, torch.tensor([diff], dtype=torch.float64, device=data.device), group)
    worst = max(float(d) for d in diffs) / max(float(torch.linalg.vector_norm(first)), 1e-30)
    if dist.get_rank() != ranks[0] or ps.get_tensor_model_parallel_rank() != 0:
        return
    if ps.get_data_parallel_rank(with_context_parallel=True) != 0:
        return
    steps = "1 training step" if calls == 1 else f"{calls} training steps"
    logger.warning(
        "the copies of the tied word-embedding / output weight differ across the pipeline "
        "stages of the embedding group (ranks %s, relative difference ~%.2g) after %s: their "
        "gradients were not summed over the embedding group, so each stage trains its own "
        "copy; wrap each model chunk in DistributedDataParallel and call "
        "finalize_model_grads(model) before optimizer.step() (with a plain torch optimizer "
        "too), or all-reduce that weight's grad over parallel_state.get_embedding_group()",
        ranks, worst, steps,
    )  # fmt: skip


def _position_embedding_weight(module) -> torch.Tensor | None:
    """The learned position table: `module.position_embeddings` (T5, Megatron's hook for this
    all-reduce) or `module.embedding.position_embeddings` (GPT, BERT); None if absent."""
    table = getattr(module, "position_embeddings", None)
    if table is None:
        table = getattr(getattr(module, "embedding", None), "position_embeddings", None)
    return None if table is None else table.weight


def _allreduce_position_embedding_grads(model: list, ps) -> None:
    """Sum the learned position-embedding grad over the position-embedding group, so every
    stage holding a copy (T5: encoder and decoder first stages) takes the same step.

    A rank of a group of more than one must hold position embeddings unless the model has no
    learned table at all (rope / relative / none: a model-wide choice, so every member skips).
    """
    if ps.get_pipeline_model_parallel_world_size() == 1:
        return
    if not ps.is_rank_in_position_embedding_group():
        return
    group = ps.get_position_embedding_group()
    if dist.get_world_size(group) == 1:
        return
    module = _embedding_stage_module(model, ps)
    if module is None or not getattr(module, "pre_process", False):
        raise ValueError(
            f"rank {dist.get_rank()} is in the position-embedding group "
            f"{dist.get_process_group_ranks(group)} but its model chunk does not embed tokens "
            "(pre_process is False): get_position_embedding_ranks must list only stages "
            "that hold position embeddings (finalize_model_grads.py)"
        )
    weight = _position_embedding_weight(module)
    if weight is None or not weight.requires_grad:
        return
    grad = _main_grad(weight)
    if grad is None:
        # A learned table that got no grad on this stage still joins the sum with zeros.
        grad = weight.grad = torch.zeros_like(weight)
    dist.all_reduce(grad, group=group)


def _check_bare_chunk(index: int, chunk, dp_cp_group) -> None:
    """A chunk not wrapped in DistributedDataParallel keeps its grads in `.grad`: the TP and
    embedding all-reduces below handle them, but nothing would average them over data-parallel
    copies, so more than one copy is refused (the same answer on every rank)."""
    dp = dist.get_world_size(dp_cp_group) if dp_cp_group is not None else 1
    if dp > 1:
        raise ValueError(
            f"finalize_model_grads: model chunk {index} is a bare {type(chunk).__name__}, not "
            f"wrapped in DistributedDataParallel, and the data-parallel size is {dp}: its grads "
            "would not be averaged over the copies; wrap each chunk in "
            "DistributedDataParallel(config=..., ddp_config=..., module=chunk)"
        )


def _model_config(chunk):
    try:
        return get_model_config(chunk)
    except RuntimeError:
        return None


def finalize_model_grads(
    model: list[torch.nn.Module],
    num_tokens: torch.Tensor | None = None,
    pg_collection=None,
    force_all_reduce: bool | None = False,
) -> None:
    """Finish DP reduction, TP and (position) embedding all-reduces, per-token scaling (module
    doc).

    `model`: list of DDP-wrapped model chunks (one per virtual PP stage). A bare module (grads
    in `.grad`, e.g. stepped by a plain torch optimizer) is accepted when there is one
    data-parallel copy: its TP and tied-embedding grads are all-reduced as under DDP.
    `num_tokens`: 0-dim/1-element tensor with this rank's token count, or None.
    """

    if pg_collection is not None:
        tp_group = pg_collection.tp
        pp_group = pg_collection.pp
        dp_cp_group = pg_collection.dp_cp
    else:
        tp_group = ps.get_tensor_model_parallel_group()
        pp_group = ps.get_pipeline_model_parallel_group()
        dp_cp_group = ps.get_data_parallel_group(with_context_parallel=True)

    for index, chunk in enumerate(model):
        if hasattr(chunk, "finish_grad_sync"):
            chunk.finish_grad_sync(force_all_reduce=force_all_reduce)
        else:
            _check_bare_chunk(index, chunk, dp_cp_group)
    config = _model_config(model[0])
    _allreduce_non_tensor_model_parallel_grads(model, config, tp_group)
    _allreduce_word_embedding_grads(model, ps)
    _allreduce_position_embedding_grads(model, ps)
    if getattr(config, "moe_router_enable_expert_bias", False):
        # Aux-loss-free balancing: one bias step per iteration from the tokens each expert got.
        from gigatron.core.transformer.moe.moe_utils import update_router_expert_bias

        update_router_expert_bias(model, config)

    if num_tokens is not None:
        last_rank = dist.get_global_rank(pp_group, dist.get_world_size(pp_group) - 1)
        dist.broadcast(num_tokens, src=last_rank, group=pp_group)
        dist.all_reduce(num_tokens, group=dp_cp_group)
        if num_tokens.item() > 0:
            for chunk in model:
                if hasattr(chunk, "scale_gradients"):
                    chunk.scale_gradients(1.0 / num_tokens.item())
                else:  # a bare module: its grads live in .grad
                    for param in chunk.parameters():
                        if param.grad is not None:
                            param.grad.div_(num_tokens.item())

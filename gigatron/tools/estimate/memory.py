"""Memory of one rank: parameters, gradients, optimizer state, activations, peak.

Parameters come from the rank's real model built on the meta device (`world.build_chunks`), so
every shape, padding and stage split is the one `gigatron train` makes; the rest follows from
them and the flags:

    gradients    DDP's buffer, one element per parameter, fp32 with --bf16 or
                 --accumulate-allreduce-grads-in-fp32, else the parameter dtype
    optimizer    Adam's two fp32 moments (SGD: its momentum buffer), plus an fp32 main copy of
                 bf16 / fp16 parameters
                 (`Precision`: another recipe, such as bench_gpt's all-bf16 AdamW, is passed in),
                 and the flat Adam step's uint8 group id per element (`flat_adam_step_of`: the
                 distributed optimizer's default step on CUDA); divided over the DP x CP
                 group (expert parameters: the expert-DP group) with --use-distributed-optimizer
    activations  `activations.py` per chunk, times the microbatches the schedule holds at once
                 (`schedule_plan.peak_in_flight`)
    FSDP         (--use-megatron-fsdp / --use-torch-fsdp2) fp32 shards of params, grads and
                 moments divided over DP x CP (not with no_shard), plus the compute-dtype
                 copies FSDP gathers (`_fsdp_state`) counted with the transients
    peak         all of the above, plus the largest transient of backward (on the last stage the
                 cross entropy's: the fp32 logits' gradient, or with --cross-entropy-loss-fusion
                 its chunk buffers; one layer's gradients otherwise; a recomputed chunk's
                 activations under full recompute)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gigatron.core import parallel_state as ps
from gigatron.core.pipeline_parallel.schedule_plan import peak_in_flight, rank_steps_and_slots
from gigatron.tools.estimate import activations as act
from gigatron.training.utils import args_by_name


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter of each training state."""

    param: int
    grad: int
    master: int  # the optimizer's fp32 copy of low-precision parameters (0: none)
    moment: int  # each of the optimizer's moments
    group_id: int = 0  # the flat Adam step's uint8 param-group index per element (1: kept)
    moments: int = 2  # Adam's two; SGD's momentum buffer (one, none without momentum)

    @property
    def optimizer(self) -> int:
        return self.master + self.moments * self.moment + self.group_id

    @property
    def update_traffic(self) -> int:
        """Bytes the Adam update reads and writes per parameter: the gradient read, the moments
        and the main copy read and written, the model parameter written (and read when it is
        its own main copy), the flat step's group id read."""
        param_traffic = self.param if self.master else 2 * self.param
        state = self.master + self.moments * self.moment
        return self.grad + 2 * state + param_traffic + self.group_id


def flat_adam_step_of(args, grad_bytes: int) -> bool:
    """Whether a GPU run of these flags steps through the distributed optimizer's flat Adam
    step, which keeps a uint8 param-group id per element: `--flat-adam-step`, or by default on
    CUDA where it applies (Adam, fp32 grad buffers, no fp16 loss scaler), not with
    `--no-flat-adam-step` (gigatron/core/optimizer/_flat_adam_step.py)."""
    if not args.use_distributed_optimizer:
        return False
    applies = args.optimizer == "adam" and grad_bytes == 4 and not args.fp16
    if args.flat_adam_step and not applies:  # training refuses it too (FlatAdamStep._check)
        raise ValueError(
            f"--flat-adam-step needs Adam with fp32 gradients and no fp16 loss scaler, got "
            f"--optimizer {args.optimizer}, {grad_bytes}-byte gradients, fp16={args.fp16} "
            "(gigatron/tools/estimate/memory.py)"
        )
    return applies if args.flat_adam_step is None else bool(args.flat_adam_step)


def precision_of(args) -> Precision:
    """Megatron's mixed precision from the flags: bf16 / fp16 parameters get an fp32 main copy
    and fp32 moments; gradients are fp32 with --bf16 or --accumulate-allreduce-grads-in-fp32;
    the flat Adam step (`flat_adam_step_of`) adds its group ids."""
    p = args.params_dtype.itemsize
    grad = (
        4
        if (
            p == 4
            or args.accumulate_allreduce_grads_in_fp32
            or (args.bf16 and not getattr(args, "grad_reduce_in_bf16", False))
        )
        else p
    )
    flat = int(flat_adam_step_of(args, grad))
    moments = 2 if args.optimizer == "adam" else int(bool(getattr(args, "sgd_momentum", 0.9)))
    return Precision(
        param=p, grad=grad, master=0 if p == 4 else 4, moment=4, group_id=flat, moments=moments
    )


def shape_of(args, config) -> act.Shape:
    """The activation accounting's sizes from validated training args and the model's
    TransformerConfig (a built chunk's `.config`)."""
    return act.Shape.of(
        config, **args_by_name(args, "seq_length micro_batch_size padded_vocab_size")
    )


def _chunk_activation_bytes(args, chunk, sh: act.Shape) -> tuple[int, int]:
    """(bytes one microbatch leaves on `chunk` for backward, the largest transient of its
    backward) for a meta-built chunk."""
    layers = list(chunk.decoder.layers)
    per_layer = [act.layer_bytes(sh, moe=_moe(args, layer)) for layer in layers]
    transient = act.layer_grad_bytes(sh) if layers else 0
    if args.recompute_granularity == "full" and layers:
        n = args.recompute_num_layers or 1
        if args.recompute_method == "block":  # the first n layers checkpointed one by one
            kept = sum(per_layer[n:]) + min(n, len(layers)) * act.recompute_input_bytes(sh)
        else:
            kept = -(-len(layers) // n) * act.recompute_input_bytes(sh)
        total = kept
        # a recomputed group's activations; under block the layers kept whole (after the
        # checkpointed ones) have run their backward and freed theirs by then
        if args.recompute_method == "block":
            recomputed = max(per_layer) - sum(per_layer[n:])
        else:
            recomputed = max(per_layer) * min(n, len(layers))
        transient = max(transient, recomputed)  # a recomputed chunk's activations
    else:
        total = sum(per_layer)
    if chunk.post_process:
        total += act.head_bytes(sh)
        transient = max(transient, act.logits_grad_bytes(sh))
    if chunk.pre_process:
        total += sh.tokens * 10  # token and position ids the embedding keeps
    if not chunk.post_process and not chunk.config.deallocate_pipeline_outputs:
        total += act.recompute_input_bytes(sh)  # the schedule keeps the sent output [s, b, h]
    return total, transient


def _moe(args, layer) -> tuple[int, int, int] | None:
    """(expert ffn, top-k, experts) of an MoE layer; None for a dense one."""
    if not hasattr(layer.mlp, "router"):
        return None
    return (
        args.moe_ffn_hidden_size or args.ffn_hidden_size,
        args.moe_router_topk,
        args.num_experts,
    )


def _is_expert(param) -> bool:
    return not getattr(param, "allreduce", True)


def fsdp_strategy_of(args) -> str | None:
    """The FSDP sharding strategy of the flags (`--use-torch-fsdp2`: optim_grads_params), or
    None without FSDP."""
    if getattr(args, "use_torch_fsdp2", False):
        return "optim_grads_params"
    if getattr(args, "use_megatron_fsdp", False):
        return args.data_parallel_sharding_strategy
    return None


def _fsdp_state(args, chunks, prec: Precision, strategy: str) -> tuple[int, int, int, int]:
    """(param, grad, optimizer bytes at rest, bytes of gathered compute copies) under FSDP
    (docs/fsdp.md): fp32 shards of ceil(rows / dp) rows each (FSDP2 pads every param to that)
    for param, grad and the optimizer's moments; the gathered copies in the compute dtype: the
    whole model from forward to backward, or under optim_grads_params two layers (the one
    computing, the one prefetched) plus the root's params."""
    from gigatron.core.transformer.transformer_layer import TransformerLayer

    dp = (
        1 if strategy == "no_shard" else ps.get_data_parallel_world_size(with_context_parallel=True)
    )
    params = [p for c in chunks for p in c.parameters()]
    local = sum(-(-p.shape[0] // dp) * (p.numel() // max(p.shape[0], 1)) for p in params)
    total = sum(p.numel() for p in params)
    compute = 2 if args.bf16 else 4
    if strategy == "optim_grads_params":
        layers = [m for c in chunks for m in c.modules() if isinstance(m, TransformerLayer)]
        per_layer = [sum(p.numel() for p in m.parameters()) for m in layers] or [0]
        root = total - sum(per_layer)
        gathered = compute * (root + 2 * max(per_layer))
    else:
        gathered = compute * total
    moments = prec.moments * 4
    return 4 * local, 4 * local, moments * local, gathered


def rank_memory(args, chunks: list[torch.nn.Module], precision: Precision | None = None) -> dict:
    """This rank's memory in bytes (inside `world.fake_rank`, for `world.build_chunks`);
    `precision` defaults to the flags' (`precision_of`)."""
    prec = precision or precision_of(args)
    params = [p for c in chunks for p in c.parameters()]
    dense = sum(p.numel() for p in params if not _is_expert(p))
    expert = sum(p.numel() for p in params if _is_expert(p))
    p_bytes, g_bytes, o_bytes = prec.param, prec.grad, prec.optimizer
    dp_cp = ps.get_data_parallel_world_size(with_context_parallel=True)
    expt_dp = ps.get_expert_data_parallel_world_size()
    if args.use_distributed_optimizer:
        optimizer = o_bytes * (dense // dp_cp + expert // expt_dp)
    else:
        optimizer = o_bytes * (dense + expert)
    strategy = fsdp_strategy_of(args)
    gathered = 0
    if strategy is not None:
        param_bytes, grad_bytes, optimizer, gathered = _fsdp_state(args, chunks, prec, strategy)
    sh = shape_of(args, chunks[0].config)
    per_chunk = [_chunk_activation_bytes(args, c, sh) for c in chunks]
    num_mb = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    steps, _ = rank_steps_and_slots(
        pp_size=ps.get_pipeline_model_parallel_world_size(),
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        num_microbatches=num_mb,
        num_model_chunks=len(chunks),
    )
    activations = peak_in_flight(steps, [a for a, _ in per_chunk])
    transient = max(t for _, t in per_chunk) + gathered
    if strategy is None:
        param_bytes, grad_bytes = (dense + expert) * p_bytes, (dense + expert) * g_bytes
    out = {
        "params": dense + expert,
        "expert_params": expert,
        "param_bytes": param_bytes,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": optimizer,
        "activation_bytes": activations,
        "transient_bytes": transient,
    }
    out["peak_bytes"] = sum(v for k, v in out.items() if k.endswith("_bytes"))
    return out

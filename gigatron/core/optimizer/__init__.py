"""Optimizers for Megatron-style models: `megatron.core.optimizer`.

`get_megatron_optimizer(config, model_chunks)` groups the params of DDP-wrapped model chunks
(no weight decay for biases and 1-D params, decoupled lr for embedding/output params), builds a
torch AdamW/Adam/SGD, and wraps it: FP32Optimizer (fp32), Float16OptimizerWithFloat16Params
(bf16/fp16 with fp32 main params) or DistributedOptimizer (sharded over DP); chunks wrapped
in FullyShardedDataParallel / TorchFullyShardedDataParallel get an FP32Optimizer over their
DTensor shards (`_fully_sharded_optimizer.py`). Dense and expert
params get separate optimizers (different DP groups), joined by a ChainedOptimizer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.distributed as dist

from gigatron.core import parallel_state as ps
from gigatron.core.optimizer._fully_sharded_optimizer import FullyShardedOptimizer
from gigatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from gigatron.core.optimizer.emerging_optimizers import (
    _EMERGING_OPTIMIZERS,
    HAVE_EMERGING_OPTIMIZERS,
    Lion,
    _create_emerging_optimizer,
    _get_qkv_split_shapes,
    check_emerging_config,
    model_config_of,
)
from gigatron.core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler
from gigatron.core.optimizer.optimizer import (
    ChainedOptimizer,
    Float16OptimizerWithFloat16Params,
    FP32Optimizer,
    MegatronOptimizer,
    MixedPrecisionOptimizer,
)
from gigatron.core.optimizer.optimizer_config import (
    AdamOptimizerConfig,
    OptimizerConfig,
    ParamKey,
    ParamPredicate,
    ParamWithNamePredicate,
    SGDOptimizerConfig,
)

__all__ = [
    "HAVE_EMERGING_OPTIMIZERS",
    "AdamOptimizerConfig",
    "ChainedOptimizer",
    "ConstantGradScaler",
    "DistributedOptimizer",
    "DynamicGradScaler",
    "FP32Optimizer",
    "Float16OptimizerWithFloat16Params",
    "MegatronOptimizer",
    "MixedPrecisionOptimizer",
    "OptimizerConfig",
    "ParamKey",
    "ParamPredicate",
    "ParamWithNamePredicate",
    "SGDOptimizerConfig",
    "get_megatron_optimizer",
    "get_standard_config_overrides",
]

_FILE = "gigatron/core/optimizer/__init__.py"


def get_standard_config_overrides(config: OptimizerConfig) -> dict[ParamKey, dict]:
    """Megatron's default overrides: wd_mult 0 for "*.bias" and 1-D params (q/k layernorms
    excepted with apply_wd_to_qk_layernorm); decoupled lr for embedding/output params."""
    if config.apply_wd_to_qk_layernorm:
        key = ParamKey(
            with_name_predicate=ParamWithNamePredicate(
                "s1_not_qkln",
                lambda p, n: (
                    (p.dim() == 1 or n.endswith(".bias"))
                    and not ("q_layernorm." in n or "k_layernorm." in n)
                ),
            )
        )
    else:
        key = ParamKey(
            name="*.bias", predicate=ParamPredicate("param_len_1", lambda p: p.dim() == 1)
        )
    overrides: dict[ParamKey, dict] = {key: {"wd_mult": 0.0}}
    if config.decoupled_lr is not None:
        decoupled = {"max_lr": config.decoupled_lr}
        if config.decoupled_min_lr is not None:
            decoupled["min_lr"] = config.decoupled_min_lr
        overrides[ParamKey(attr="is_embedding_or_output_parameter")] = decoupled
    return overrides


def _param_override(name, param, config_overrides, no_wd_cond, scale_lr_cond, lr_mult, config):
    merged: dict = {}
    for key, override in config_overrides.items():
        if not key.matches(param, name):
            continue
        for k, v in override.items():
            if k in merged and merged[k] != v:
                raise ValueError(
                    f"conflicting config_overrides for {name}: {k} = {merged[k]} and {v} ({_FILE})"
                )
            merged[k] = v
    if no_wd_cond is not None:  # legacy API: replaces the default bias / 1-D rule
        merged.pop("wd_mult", None)
        if no_wd_cond(name, param):
            merged["wd_mult"] = 0.0
    if scale_lr_cond is not None and scale_lr_cond(name, param):
        merged.update(lr_mult=lr_mult, max_lr=config.lr * lr_mult)
        if config.min_lr is not None:
            merged["min_lr"] = config.min_lr * lr_mult
    return tuple(sorted(merged.items()))


def _get_param_groups(model_chunks, config, config_overrides, no_wd_cond, scale_lr_cond, lr_mult):
    """One group per (override set, is_expert_parallel), identical keys on every rank."""
    if config_overrides is None:
        config_overrides = get_standard_config_overrides(config)
    params_map: dict[tuple, list] = {}
    for chunk in model_chunks:
        for name, param in chunk.named_parameters():
            if not param.requires_grad:
                continue
            override = _param_override(
                name, param, config_overrides, no_wd_cond, scale_lr_cond, lr_mult, config
            )
            key = (override, not getattr(param, "allreduce", True))
            params_map.setdefault(key, []).append(param)
    keys = list(params_map)
    if dist.is_initialized() and dist.get_world_size() > 1:
        # Every rank needs the same groups (checkpoints, collective counts in step()).
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, keys)
        for other in gathered:
            keys += [k for k in other if k not in keys]
    groups = []
    for key in sorted(keys, key=lambda k: (k[1], len(k[0]) > 0, repr(k[0]))):
        override, is_expert = key
        override = dict(override)
        group = {
            "params": params_map.get(key, []),
            "is_expert_parallel": is_expert,
            "default_config": not any("lr" in k for k in override),
            "wd_mult": 1.0,
            "lr_mult": 1.0,
            "is_decoupled_lr": "max_lr" in override and config.decoupled_lr is not None,
            "max_lr": config.lr,
            "min_lr": config.min_lr,
            **override,
        }
        # Megatron leaves weight decay to the scheduler; starting from wd * wd_mult makes a
        # scheduler-less run honour "no decay on biases/norms" too (the scheduler overwrites it).
        group["weight_decay"] = config.weight_decay * group["wd_mult"]
        groups.append(group)
    return groups


def _torch_optimizer(config: OptimizerConfig, groups: list[dict]) -> torch.optim.Optimizer:
    if config.optimizer == "adam":
        cls = torch.optim.AdamW if config.decoupled_weight_decay else torch.optim.Adam
        params = [p for g in groups for p in g["params"]]
        # One fused kernel for the whole step when every parameter is on a GPU; on any device
        # with config.sync_free_step (its kernel does the clipping and the NaN skip)
        on_gpu = all(p.is_cuda for p in params)
        fused = bool(params) and (on_gpu or config.sync_free_step)
        fused = fused and all(p.dtype.is_floating_point for p in params)
        return cls(
            groups,
            lr=config.lr,
            weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            **({"fused": True} if fused else {}),
        )
    if config.optimizer == "lion":
        return Lion(
            groups,
            lr=config.lr,
            betas=(config.lion_beta1, config.lion_beta2),
            weight_decay=config.weight_decay,
        )
    return torch.optim.SGD(
        groups, lr=config.lr, weight_decay=config.weight_decay, momentum=config.sgd_momentum
    )


def _grad_scaler(config: OptimizerConfig):
    if config.loss_scale:
        return ConstantGradScaler(config.loss_scale)
    if config.fp16:
        return DynamicGradScaler(
            initial_scale=config.initial_loss_scale,
            min_scale=config.min_loss_scale,
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=config.loss_scale_window,
            hysteresis=config.hysteresis,
        )
    return None


def _groups_from_state(expert: bool, pg_collection=None):
    """(DP group to shard over, grad-stats group of the plain optimizers, grad-stats group of
    the distributed optimizer (None = every rank: shards differ everywhere), TP group)."""
    if pg_collection is not None:
        pg = pg_collection
        intra = getattr(pg, "intra_dist_opt", None)
        if expert:
            return pg.expt_dp, pg.tp_ep_pp, intra, pg.expt_tp
        return pg.dp_cp, pg.mp, intra, pg.tp

    if not ps.model_parallel_is_initialized():
        return None, None, None, None
    if expert:
        return (
            ps.get_expert_data_parallel_group(),
            ps.get_expert_tensor_model_pipeline_parallel_group(),
            None,
            ps.get_expert_tensor_parallel_group(),
        )
    return (
        ps.get_data_parallel_group(with_context_parallel=True),
        ps.get_model_parallel_group(),
        None,
        ps.get_tensor_model_parallel_group(),
    )


def _state_names(optimizer: str) -> tuple[str, ...]:
    return {"adam": ("exp_avg", "exp_avg_sq"), "lion": ("exp_avg",)}.get(optimizer, ())


def _build(
    config, groups, model_chunks, expert: bool, pg_collection, inner=None, init_state_fn=None
) -> MegatronOptimizer:
    """Wrap `inner` (default: the torch optimizer `config.optimizer` names) for `groups`."""
    dp_group, mp_group, world, tp_group = _groups_from_state(expert, pg_collection)
    if inner is None:
        inner = _torch_optimizer(config, groups)
    names = _state_names(config.optimizer)

    def default_init_state_fn(opt, _config=None):
        for group in opt.param_groups:
            for p in group["params"]:
                if not opt.state[p]:
                    for name in names:
                        opt.state[p][name] = torch.zeros_like(p.data)

    init_state_fn = init_state_fn or default_init_state_fn

    scaler = _grad_scaler(config)
    sharded = [getattr(c, "data_parallel_sharding_strategy", None) for c in model_chunks]
    if any(getattr(c, "is_fully_sharded", False) for c in model_chunks):
        if config.fp16:
            raise ValueError(
                f"OptimizerConfig.fp16 (True) is not supported with FSDP-sharded chunks ({_FILE})"
            )
        opt = FullyShardedOptimizer(inner, config, init_state_fn)
        # shards differ on every rank; no_shard's are replicas over DP
        opt.grad_stats_parallel_group = mp_group if "no_shard" in sharded else world
    elif config.use_distributed_optimizer:
        attr = "expert_parallel_buffers" if expert else "buffers"
        per_model_buffers = {i: getattr(c, attr, []) for i, c in enumerate(model_chunks)}
        opt = DistributedOptimizer(
            inner, config, scaler, init_state_fn, model_chunks, per_model_buffers, dp_group
        )
        opt.grad_stats_parallel_group = world
    elif config.fp16 or config.bf16:
        opt = Float16OptimizerWithFloat16Params(inner, config, scaler, init_state_fn)
        opt.grad_stats_parallel_group = mp_group
    else:
        opt = FP32Optimizer(inner, config, init_state_fn)
        opt.grad_stats_parallel_group = mp_group
    opt.tp_group = tp_group
    return opt


def get_megatron_optimizer(
    config: OptimizerConfig,
    model_chunks: list[torch.nn.Module],
    config_overrides: dict[ParamKey, dict] | None = None,
    use_gloo_process_groups: bool = True,
    pg_collection=None,
    dump_param_to_param_group_map: str | None = None,
    *,
    no_weight_decay_cond: Callable[[str, torch.nn.Parameter], bool] | None = None,
    scale_lr_cond: Callable[[str, torch.nn.Parameter], bool] | None = None,
    lr_mult: float = 1.0,
) -> MegatronOptimizer:
    """Build the Megatron optimizer for DDP-wrapped `model_chunks` (see module doc).

    `pg_collection`: a ProcessGroupCollection (tp, mp, dp_cp, expt_dp, expt_tp, tp_ep_pp);
    default: parallel_state's groups. `use_gloo_process_groups` has no effect (CPU groups are
    gloo already). `no_weight_decay_cond`, `scale_lr_cond`, `lr_mult`: the pre-0.14 Megatron
    API, keyword-only here (applied on top of `config_overrides`).
    """
    if config.lr is None:
        raise ValueError(f"OptimizerConfig.lr (None) must be set ({_FILE})")
    if dump_param_to_param_group_map is not None:
        raise ValueError(
            "get_megatron_optimizer: dump_param_to_param_group_map is not supported by gigatron "
            f"({_FILE})"
        )
    if not isinstance(model_chunks, list):
        model_chunks = [model_chunks]
    if config.optimizer not in ("adam", "sgd"):
        return _get_megatron_emerging_optimizer(
            config, model_chunks, config_overrides, pg_collection
        )
    groups = _get_param_groups(
        model_chunks, config, config_overrides, no_weight_decay_cond, scale_lr_cond, lr_mult
    )
    dense = [g for g in groups if not g["is_expert_parallel"]]
    expert = [g for g in groups if g["is_expert_parallel"]]
    optimizers = []
    if dense:
        optimizers.append(_build(config, dense, model_chunks, False, pg_collection))
    if expert:
        optimizers.append(_build(config, expert, model_chunks, True, pg_collection))
    if not optimizers:
        raise ValueError(f"get_megatron_optimizer: the model has no trainable params ({_FILE})")
    return optimizers[0] if len(optimizers) == 1 else ChainedOptimizer(optimizers)


def _tag_emerging_params(model_chunks) -> None:
    """Megatron's tags: `expert_tp` on routed-expert weights, `is_qkv` / `qkv_split_shapes` on
    fused QKV weights whose rows hold whole query groups."""
    for chunk in model_chunks:
        model_cfg = model_config_of(chunk)
        for name, param in chunk.named_parameters():
            if not param.requires_grad:
                continue
            if "experts" in name and "shared" not in name:
                param.expert_tp = True
            if "linear_qkv.weight" in name and param.dim() == 2 and model_cfg is not None:
                shapes = _get_qkv_split_shapes(model_cfg)
                if param.shape[0] % sum(shapes) == 0:
                    param.is_qkv = True
                    param.qkv_split_shapes = shapes


def _muon_process_groups(pg_collection):
    if pg_collection is not None or not ps.model_parallel_is_initialized():
        return pg_collection
    from gigatron.core.process_groups_config import ProcessGroupCollection

    return ProcessGroupCollection.use_mpu_process_groups(["tp", "expt_tp"])


def _get_megatron_emerging_optimizer(config, model_chunks, config_overrides, pg_collection):
    """Muon / Lion on the 2-D weights, the scalar optimizer on the rest (Megatron's split:
    a default config override `{"optimizer": "adam"}` on the excluded params), chained."""
    eopt_name = config.optimizer
    if eopt_name not in _EMERGING_OPTIMIZERS:
        raise ValueError(f"Unsupported emerging optimizer: {eopt_name}")
    if config.fp16:
        raise ValueError("emerging optimizer with fp16 is not supported.")
    check_emerging_config(config)
    if config.use_distributed_optimizer:
        raise ValueError(
            f"OptimizerConfig.use_distributed_optimizer (True) is not supported with "
            f"optimizer={eopt_name!r}: Megatron's training turns it into "
            f"use_layer_wise_distributed_optimizer ({_FILE})"
        )
    _tag_emerging_params(model_chunks)
    overrides = dict(
        get_standard_config_overrides(config) if config_overrides is None else config_overrides
    )
    defaults = copy.deepcopy(_EMERGING_OPTIMIZERS[eopt_name].default_param_overrides)
    if eopt_name == "muon":
        for override in defaults.values():
            override["optimizer"] = config.muon_scalar_optimizer
    overrides.update(defaults)
    groups = _get_param_groups(model_chunks, config, overrides, None, None, 1.0)
    buckets: dict[tuple[str, bool], list[dict]] = {}
    for group in groups:
        key = (group.get("optimizer", eopt_name), group["is_expert_parallel"])
        buckets.setdefault(key, []).append(group)
    results = []
    for (opt_name, expert), bucket in buckets.items():
        if opt_name == eopt_name:
            inner, init_fn = _create_emerging_optimizer(
                config, bucket, eopt_name, model_chunks, _muon_process_groups(pg_collection)
            )
            results.append(
                _build(config, bucket, model_chunks, expert, pg_collection, inner, init_fn)
            )
            continue
        fallback = copy.copy(config)
        fallback.optimizer = opt_name
        result = _build(fallback, bucket, model_chunks, expert, pg_collection)
        result.config = config
        results.append(result)
    return ChainedOptimizer(results)

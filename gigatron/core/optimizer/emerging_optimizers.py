"""Emerging optimizers: Muon with tensor parallelism, and Lion; mirrors
`megatron.core.optimizer.emerging_optimizers` (names, registry, QKV split, TP modes).

Megatron builds these from NVIDIA's `emerging_optimizers` package; gigatron implements the same
numerics itself (the package needs Python >= 3.12 and absl; see docs/optimizer.md). The math:

Muon (per 2-D weight W with grad G, momentum buffer M, group lr / weight_decay / momentum mu):

    W <- W - lr * wd * W                       decoupled weight decay (always, as Megatron's
                                               TensorParallelMuon is built)
    M <- mu * M + (1 - mu) * G                 EMA momentum
    U = (1 - mu) * G + mu * M  if nesterov  else  M
    W <- W - lr * extra_scale * scale(out, in) * NS(U)

NS is `_newton_schulz.newton_schulz(_tp)`; `scale` the scale mode's factor of the whole
matrix's shape. A fused QKV weight [ng * (q + k + v), h] is orthogonalised as three matrices
(Q, K and V rows of every group) with `split_qkv`.

Lion (Chen et al. 2023): W <- W - lr * wd * W; U = sign((1 - b1) * G + b1 * M);
M <- b2 * M + (1 - b2) * G; W <- W - lr * U.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from gigatron.core.optimizer._newton_schulz import (
    COEFFICIENT_SETS,
    FP32_MATMUL_PRECISIONS,
    SCALE_MODES,
    TP_MODES,
    get_muon_scale_factor,
    newton_schulz_tp,
)
from gigatron.core.optimizer.optimizer_config import ParamKey, ParamPredicate

# Megatron's flag for the `emerging_optimizers` package: gigatron's own implementations of its
# Muon and Lion are always present.
HAVE_EMERGING_OPTIMIZERS = True


def get_supported_coefficient_types() -> tuple[str, ...]:
    """Newton-Schulz coefficient sets `muon_coefficient_type` may name."""
    return tuple(COEFFICIENT_SETS)


def validate_coefficient_type(coefficient_type: str) -> None:
    """ValueError if `coefficient_type` is not a known coefficient set."""
    supported = get_supported_coefficient_types()
    if coefficient_type not in supported:
        raise ValueError(
            f"Unsupported muon coefficient type '{coefficient_type}'. Supported types: {supported}"
        )


@contextmanager
def _fp32_matmul_precision(precision: str):
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def _is_nonlinear_or_embedding(param) -> bool:
    """True for parameters the emerging optimizer does not take (not 2-D, embedding, output)."""
    return getattr(param, "is_embedding_or_output_parameter", False) or param.dim() != 2


def _is_muon_excluded(param) -> bool:
    """True for parameters that go to the scalar optimizer instead of Muon."""
    return not getattr(param, "use_muon", True) or _is_nonlinear_or_embedding(param)


def model_config_of(chunk):
    """The chunk's TransformerConfig, or None (a plain module, or a DDP over one: no QKV)."""
    cfg = getattr(chunk, "config", None)
    return cfg if getattr(cfg, "num_attention_heads", None) else None


def _get_qkv_split_shapes(model_cfg) -> list[int]:
    """Rows of Q, K and V in one query group of the fused QKV weight (Megatron's layout)."""
    q_rows = model_cfg.num_attention_heads // model_cfg.num_query_groups * model_cfg.kv_channels
    if getattr(model_cfg, "attention_output_gate", False):
        return [q_rows, q_rows, model_cfg.kv_channels, model_cfg.kv_channels]
    return [q_rows, model_cfg.kv_channels, model_cfg.kv_channels]


class TensorParallelMuon(torch.optim.Optimizer):
    """Muon over tensor-parallel weights (see module doc); Megatron's constructor arguments.

    `tp_mode`: "duplicated" / "distributed" orthogonalise the whole matrix (TP-invariant
    results), "blockwise" each shard on its own (scale factor of the shard's shape).
    `pg_collection`: its `tp` / `expt_tp` groups (None: every weight is whole).
    """

    state_names = ("momentum_buffer",)  # per-parameter state, one tensor of its shape each

    def __init__(
        self,
        params,
        lr: float = 3e-4,
        momentum: float = 0.95,
        nesterov: bool = True,
        weight_decay: float = 0.01,
        use_decoupled_weight_decay: bool = True,
        split_qkv: bool = False,
        is_qkv_fn: Callable[[torch.Tensor], bool] | None = None,
        qkv_split_shapes: list[int] | None = None,
        fp32_matmul_prec: str = "medium",
        coefficient_type: str = "quintic",
        num_ns_steps: int = 5,
        scale_mode: str = "spectral",
        extra_scale_factor: float = 1.0,
        pg_collection=None,
        tp_mode: str = "duplicated",
        use_syrk: bool = False,
    ) -> None:
        if num_ns_steps < 1:
            raise ValueError(f"num_ns_steps must be at least 1, got {num_ns_steps}")
        validate_coefficient_type(coefficient_type)
        if use_syrk:
            raise ValueError("use_syrk (the Triton SYRK kernel) is not implemented by gigatron")
        self.nesterov = nesterov
        self.weight_decay_method = "decoupled" if use_decoupled_weight_decay else "l2"
        self.fp32_matmul_prec = fp32_matmul_prec
        self.coefficient_type = coefficient_type
        self.num_ns_steps = num_ns_steps
        self.scale_mode = scale_mode
        self.extra_scale_factor = extra_scale_factor
        self.pg_collection = pg_collection
        self.tp_mode = tp_mode
        self.split_qkv = split_qkv
        self.is_qkv_fn = is_qkv_fn or (lambda p: getattr(p, "is_qkv", False))
        self.qkv_split_shapes = qkv_split_shapes
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    def _init_group(self, group: dict, skip_non_grad_params: bool = True) -> None:
        for p in group["params"]:
            if skip_non_grad_params and p.grad is None:
                continue
            if len(self.state[p]) == 0:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p.data)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("closure is not supported")
        for group in self.param_groups:
            self._init_group(group)
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if wd != 0.0:
                    if self.weight_decay_method == "decoupled":
                        p.add_(p, alpha=-wd * lr)
                    else:
                        grad.add_(p, alpha=wd)
                buf = self.state[p]["momentum_buffer"]
                buf.lerp_(grad, 1 - mu)
                update = grad.lerp(buf, mu) if self.nesterov else buf
                with _fp32_matmul_precision(self.fp32_matmul_prec):
                    update = self.orthogonalize(p, update)
                p.add_(update, alpha=-lr)
        return None

    def scaled_orthogonalize_fn(self, grad, tp_group, partition_dim: int | None = None):
        """Scaled NS of the matrix whose shard along `partition_dim` is `grad` [m, n]."""
        size = [grad.size(0), grad.size(1)]
        if partition_dim is not None and tp_group is not None:
            size[partition_dim] *= dist.get_world_size(tp_group)
        mode = "duplicated" if self.tp_mode == "blockwise" else self.tp_mode
        orth = newton_schulz_tp(
            grad,
            self.num_ns_steps,
            self.coefficient_type,
            tp_group,
            partition_dim=partition_dim,
            tp_mode=mode,
        )
        scale = get_muon_scale_factor(size[0], size[1], mode=self.scale_mode)
        return orth * scale * self.extra_scale_factor

    def _tp_group_and_dim(self, p):
        pg = self.pg_collection
        tp_group = None
        if pg is not None:
            tp_group = pg.expt_tp if getattr(p, "expert_tp", False) else pg.tp
        # Only a TP-split weight has shards to join; a replicated one is whole on every rank.
        split = getattr(p, "tensor_model_parallel", False) and self.tp_mode != "blockwise"
        dim = getattr(p, "partition_dim", None) if split else None
        return tp_group, (None if dim == -1 else dim)

    def orthogonalize(self, p: torch.Tensor, grad: torch.Tensor, **_: Any) -> torch.Tensor:
        """Scaled orthogonalised `grad` (this rank's shard of `p`'s update)."""
        tp_group, dim = self._tp_group_and_dim(p)
        if not (self.split_qkv and self.is_qkv_fn(p)):
            return self.scaled_orthogonalize_fn(grad, tp_group, dim)
        shapes = getattr(p, "qkv_split_shapes", None) or self.qkv_split_shapes
        if shapes is None:
            raise RuntimeError("Muon QKV split requested but qkv_split_shapes is not set")
        rows_per_group = sum(shapes)
        if grad.size(0) % rows_per_group != 0:
            raise RuntimeError(
                f"Muon QKV split shape mismatch: grad_shape={tuple(grad.shape)}, "
                f"split_shapes={shapes}"
            )
        num_groups = grad.size(0) // rows_per_group  # query groups on this rank
        h = grad.size(1)
        parts = torch.split(grad.view(num_groups, rows_per_group, h), shapes, dim=1)
        parts = [
            self.scaled_orthogonalize_fn(part.reshape(-1, h), tp_group, dim).view(num_groups, -1, h)
            for part in parts
        ]
        return torch.cat(parts, dim=1).view(grad.shape)


class Lion(torch.optim.Optimizer):
    """Lion (see module doc): `betas` = (b1 of the sign update, b2 of the momentum EMA)."""

    state_names = ("exp_avg",)  # per-parameter state, one tensor of its shape each

    def __init__(
        self,
        params,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.01,
        *,
        weight_decay_method: str = "decoupled",
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta at index {i}: {beta}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if weight_decay_method not in ("decoupled", "l2"):
            raise ValueError(f"weight_decay_method {weight_decay_method!r}: 'decoupled' or 'l2'")
        self.weight_decay_method = weight_decay_method
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    def _init_group(self, group: dict, skip_non_grad_params: bool = True) -> None:
        for p in group["params"]:
            if skip_non_grad_params and p.grad is None:
                continue
            if len(self.state[p]) == 0:
                self.state[p]["exp_avg"] = torch.zeros_like(p.data)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("closure is not supported")
        for group in self.param_groups:
            self._init_group(group)
            lr, wd, (beta1, beta2) = group["lr"], group["weight_decay"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, exp_avg = p.grad, self.state[p]["exp_avg"]
                if wd != 0.0:
                    if self.weight_decay_method == "decoupled":
                        p.add_(p, alpha=-wd * lr)
                    else:
                        grad.add_(p, alpha=wd)
                update = exp_avg.lerp(grad, 1 - beta1).sign_()
                exp_avg.lerp_(grad, 1 - beta2)
                p.add_(update, alpha=-lr)
        return None


def _eopt_init_state_fn(opt, config=None) -> None:
    """State for every parameter, grads or not (checkpoint templates need all of it)."""
    for group in opt.param_groups:
        opt._init_group(group, skip_non_grad_params=False)


@dataclass
class EmergingOptimizerEntry:
    """How to build one emerging optimizer: its class, state initialiser, constructor
    arguments from the config, and the per-parameter overrides it applies by default."""

    optimizer_cls: type
    init_state_fn: Callable = _eopt_init_state_fn
    config_to_kwargs: Callable | None = None
    default_param_overrides: dict = field(default_factory=dict)


def _muon_config_to_kwargs(config, model_chunks, pg_collection) -> dict:
    """TensorParallelMuon's arguments from OptimizerConfig (`muon_<name>`, else `<name>`;
    Megatron's matching, under which `use_decoupled_weight_decay` keeps its default True)."""
    model_cfg = model_config_of(model_chunks[0])
    return dict(
        lr=config.lr,
        momentum=config.muon_momentum,
        nesterov=config.muon_nesterov or config.muon_use_nesterov,
        weight_decay=config.weight_decay,
        split_qkv=config.muon_split_qkv,
        is_qkv_fn=lambda p: getattr(p, "is_qkv", False),
        qkv_split_shapes=model_cfg and _get_qkv_split_shapes(model_cfg),
        fp32_matmul_prec=config.muon_fp32_matmul_prec,
        coefficient_type=config.muon_coefficient_type,
        num_ns_steps=config.muon_num_ns_steps,
        scale_mode=config.muon_scale_mode,
        extra_scale_factor=config.muon_extra_scale_factor,
        pg_collection=pg_collection,
        tp_mode=config.muon_tp_mode,
        use_syrk=config.muon_use_syrk,
    )


def _lion_config_to_kwargs(config, model_chunks, pg_collection) -> dict:
    """Lion's arguments: lr, weight decay, (lion_beta1, lion_beta2). Megatron 0.20 passes
    (adam_beta1, adam_beta2) on this path (docs/optimizer.md)."""
    return dict(
        lr=config.lr, betas=(config.lion_beta1, config.lion_beta2), weight_decay=config.weight_decay
    )


def _default_overrides(name: str, fn: Callable) -> dict:
    return {ParamKey(predicate=ParamPredicate(name=name, fn=fn)): {"optimizer": "adam"}}


_EMERGING_OPTIMIZERS: dict[str, EmergingOptimizerEntry] = {
    "muon": EmergingOptimizerEntry(
        optimizer_cls=TensorParallelMuon,
        config_to_kwargs=_muon_config_to_kwargs,
        default_param_overrides=_default_overrides("muon_excluded", _is_muon_excluded),
    ),
    "lion": EmergingOptimizerEntry(
        optimizer_cls=Lion,
        config_to_kwargs=_lion_config_to_kwargs,
        default_param_overrides=_default_overrides(
            "nonlinear_or_embedding", _is_nonlinear_or_embedding
        ),
    ),
}


def check_emerging_config(config) -> None:
    """ValueError naming the first Muon / Lion field of `config` with a value no optimizer takes
    (run before any collective; Megatron finds these when it builds or steps the optimizer)."""
    choices = {
        "muon_scale_mode": SCALE_MODES,
        "muon_fp32_matmul_prec": FP32_MATMUL_PRECISIONS,
        "muon_tp_mode": TP_MODES,
        "muon_scalar_optimizer": ("adam", "lion"),
    }
    for name, allowed in choices.items():
        if getattr(config, name) not in allowed:
            raise ValueError(f"{name} ({getattr(config, name)!r}) must be one of {allowed}")
    validate_coefficient_type(config.muon_coefficient_type)
    if config.muon_num_ns_steps < 1:
        raise ValueError(f"num_ns_steps must be at least 1, got {config.muon_num_ns_steps}")


def _create_emerging_optimizer(config, param_groups, eopt_name, model_chunks, pg_collection):
    """(torch optimizer, init_state_fn) of emerging optimizer `eopt_name` over `param_groups`."""
    entry = _EMERGING_OPTIMIZERS[eopt_name]
    kwargs = entry.config_to_kwargs(config, model_chunks, pg_collection)
    return entry.optimizer_cls(param_groups, **kwargs), entry.init_state_fn

"""Optimizer settings and per-parameter-group overrides; mirrors
`megatron.core.optimizer.optimizer_config` (OptimizerConfig, ParamKey, ParamPredicate,
ParamWithNamePredicate).

Supported: Adam/AdamW (`decoupled_weight_decay`), SGD, Muon and Lion (`emerging_optimizers`),
fp16/bf16 models with fp32 main params, constant or dynamic loss scaling, global-norm clipping,
the distributed optimizer. Megatron fields for features gigatron does not implement
(precision-aware optimizer, low-precision optimizer state, SOAP, ...) must keep their defaults.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gigatron.compat import megatron_only_fields

_FILE = "gigatron/core/optimizer/optimizer_config.py"
_OPTIMIZERS = ("adam", "sgd", "muon", "lion")


@dataclass(frozen=True)
class ParamPredicate:
    """A named `fn(param) -> bool`; hashed and compared by `name` only."""

    name: str
    fn: Callable[[torch.nn.Parameter], bool] = field(compare=False, hash=False)

    def __call__(self, param: torch.nn.Parameter) -> bool:
        return self.fn(param)


@dataclass(frozen=True)
class ParamWithNamePredicate:
    """A named `fn(param, name) -> bool`; hashed and compared by `name` only."""

    name: str
    fn: Callable[[torch.nn.Parameter, str], bool] = field(compare=False, hash=False)

    def __call__(self, param: torch.nn.Parameter, name: str) -> bool:
        return self.fn(param, name)


def _as_tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


@dataclass(frozen=True)
class ParamKey:
    """Selects parameters for a config override: matches if ANY name glob, attribute,
    predicate or name-predicate matches."""

    name: str | tuple[str, ...] = field(default_factory=tuple)
    """fnmatch globs on the parameter's qualified name (e.g. "*.bias")."""
    attr: str | tuple[str, ...] = field(default_factory=tuple)
    """Parameter attributes that must be truthy (e.g. "is_embedding_or_output_parameter")."""
    predicate: ParamPredicate | tuple[ParamPredicate, ...] = field(default_factory=tuple)
    """Predicates on the parameter."""
    with_name_predicate: ParamWithNamePredicate | tuple[ParamWithNamePredicate, ...] = field(
        default_factory=tuple
    )
    """Predicates on (parameter, name)."""

    def matches(self, param: torch.nn.Parameter, param_name: str) -> bool:
        if any(fnmatch.fnmatch(param_name, n) for n in _as_tuple(self.name)):
            return True
        if any(getattr(param, a, False) for a in _as_tuple(self.attr)):
            return True
        if any(p(param) for p in _as_tuple(self.predicate)):
            return True
        return any(p(param, param_name) for p in _as_tuple(self.with_name_predicate))


@dataclass
class OptimizerConfig(megatron_only_fields.MegatronOnlyOptimizerFields):
    """Base optimizer configuration (Megatron's field names and defaults; FP8 / Muon fields
    accepted only at their defaults, gigatron.compat.megatron_only_fields)."""

    # Learning rate (the OptimizerParamScheduler overwrites group lr every step).
    lr: float | None = None
    """Initial / max learning rate."""
    min_lr: float | None = None
    """Minimum learning rate (scheduler)."""
    decoupled_lr: float | None = None
    """Separate max lr for params tagged `is_embedding_or_output_parameter`."""
    decoupled_min_lr: float | None = None
    """Separate min lr for those params."""
    weight_decay: float = 0.01
    """L2 / decoupled weight decay coefficient."""
    apply_wd_to_qk_layernorm: bool = False
    """Apply weight decay to q/k layernorm weights (other 1-D params and biases get none)."""

    # Precision.
    fp16: bool = False
    """Model params are fp16: fp32 main params and loss scaling."""
    bf16: bool = False
    """Model params are bf16: fp32 main params."""
    params_dtype: torch.dtype = torch.float32
    """dtype of the model params."""
    use_precision_aware_optimizer: bool = False
    """Low-precision optimizer state via TE FusedAdam (not supported; must be False)."""
    store_param_remainders: bool = True
    """Precision-aware optimizer detail (no effect here)."""
    main_grads_dtype: torch.dtype = torch.float32
    """Only fp32."""
    main_params_dtype: torch.dtype = torch.float32
    """Only fp32."""
    exp_avg_dtype: torch.dtype = torch.float32
    """Only fp32."""
    exp_avg_sq_dtype: torch.dtype = torch.float32
    """Only fp32."""

    optimizer: str = "adam"
    """'adam' (AdamW if decoupled_weight_decay), 'sgd', 'muon' or 'lion' (2-D weights on Muon /
    Lion, the other params on Adam)."""

    # Loss scaling.
    loss_scale: float | None = None
    """Constant loss scale; None -> dynamic scaling for fp16, none for bf16/fp32."""
    initial_loss_scale: float = 2**32
    """Dynamic scaler's initial scale."""
    min_loss_scale: float = 1.0
    """Dynamic scaler's minimum scale."""
    loss_scale_window: float = 1000
    """Overflow-free steps before the dynamic scale doubles."""
    hysteresis: int = 2
    """Overflowing steps tolerated before the dynamic scale halves."""

    # Adam / SGD.
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2."""
    adam_eps: float = 1e-08
    """Adam epsilon."""
    decoupled_weight_decay: bool = True
    """AdamW (True) or Adam with L2 (False)."""
    sgd_momentum: float = 0.9
    """SGD momentum."""

    # Muon and Lion (emerging_optimizers.py).
    muon_momentum: float = 0.95
    """EMA momentum of Muon's internal SGD."""
    muon_split_qkv: bool = True
    """Orthogonalise the Q, K and V rows of a fused QKV weight as three matrices."""
    muon_use_nesterov: bool = False
    """megatron-core 0.16's name of muon_nesterov (either one turns Nesterov momentum on)."""
    muon_nesterov: bool = False
    """Nesterov-style momentum in Muon's internal SGD."""
    muon_scale_mode: str = "spectral"
    """Scale of the orthogonalised update: 'spectral', 'unit_rms_norm' or 'shape_scaling'."""
    muon_fp32_matmul_prec: str = "medium"
    """torch fp32 matmul precision in Newton-Schulz; 'medium' iterates on a bf16 copy."""
    muon_coefficient_type: str = "quintic"
    """Newton-Schulz coefficient set (simple, quintic, polar_express, cans, aol, deepseekv4)."""
    muon_num_ns_steps: int = 5
    """Newton-Schulz iterations."""
    muon_tp_mode: str = "duplicated"
    """TP-split weights: 'duplicated' (gather the whole matrix), 'distributed' (all-reduced
    Gram matrices; same result) or 'blockwise' (each shard on its own)."""
    muon_extra_scale_factor: float = 1.0
    """Extra factor on Muon's update."""
    muon_scalar_optimizer: str = "adam"
    """Optimizer of the params Muon does not take (embeddings, output, norms, biases): 'adam' or
    'lion'."""
    lion_beta1: float = 0.95
    """Lion's beta of the sign update."""
    lion_beta2: float = 0.98
    """Lion's beta of the momentum EMA."""

    # Distributed optimizer.
    use_distributed_optimizer: bool = False
    """Shard main params and optimizer state over the DP group (DDP must use it too)."""
    overlap_param_gather: bool = False
    """Param all-gather overlapped with the next forward (set on DDP too)."""
    overlap_param_gather_with_optimizer_step: bool = False
    """Not supported; must be False."""
    optimizer_cpu_offload: bool = False
    """Not supported; must be False."""
    optimizer_offload_fraction: float = 0.0
    """CPU offload detail (no effect here)."""
    use_torch_optimizer_for_cpu_offload: bool = False
    """CPU offload detail (no effect here)."""
    overlap_cpu_optimizer_d2h_h2d: bool = False
    """CPU offload detail (no effect here)."""
    pin_cpu_grads: bool = True
    """CPU offload detail (no effect here)."""
    pin_cpu_params: bool = True
    """CPU offload detail (no effect here)."""

    # Miscellaneous.
    clip_grad: float = 1.0
    """Clip by global L2 norm when > 0."""
    log_num_zeros_in_grad: bool = False
    """Count zero grad entries each step (third value of step())."""
    barrier_with_L1_time: bool = False
    """Timer detail (no effect here)."""
    timers: Callable | None = None
    """Timers object (no effect here)."""
    config_logger_dir: str = ""
    """Config logging directory (no effect here)."""

    # gigatron-only step options (docs/optimizer.md).
    flat_adam_step: bool | None = None
    """The distributed optimizer's flat fused Adam step (_flat_adam_step.py): None = where it
    applies (CUDA params, Adam / AdamW, fp32 grad buffers, no loss scaler); True forces it (an
    optimizer that does not qualify is an error); False = torch's fused Adam."""
    sync_free_step: bool = False
    """`step()` without a host sync: the norm stays on the device, clipping and the skip of a
    NaN/Inf step happen in the fused Adam kernel; step() returns device tensors. Needs
    clip_grad > 0, no loss scaler, Adam / AdamW (built fused on any device)."""

    def __post_init__(self) -> None:
        def bad(name, value, rule):
            return ValueError(f"OptimizerConfig.{name} ({value!r}) {rule} ({_FILE})")

        megatron_only_fields.check_config(self, "optimizer")
        if self.optimizer not in _OPTIMIZERS:
            raise bad("optimizer", self.optimizer, f"must be one of {_OPTIMIZERS}")
        if self.fp16 and self.bf16:
            raise bad("fp16", self.fp16, "and bf16 cannot both be True")
        for name in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            if getattr(self, name) != torch.float32:
                raise bad(name, getattr(self, name), "must be torch.float32 in gigatron")
        for name in (
            "use_precision_aware_optimizer",
            "optimizer_cpu_offload",
            "overlap_param_gather_with_optimizer_step",
        ):
            if getattr(self, name):
                raise bad(name, True, "is not supported by gigatron; it must be False")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise bad("overlap_param_gather", True, "requires use_distributed_optimizer=True")
        if self.loss_scale is not None and self.loss_scale <= 0:
            raise bad("loss_scale", self.loss_scale, "must be positive or None")
        if self.flat_adam_step not in (None, False, True):
            raise bad("flat_adam_step", self.flat_adam_step, "must be None, False or True")


@dataclass
class AdamOptimizerConfig(OptimizerConfig):
    """OptimizerConfig with optimizer='adam'."""

    optimizer: str = "adam"


@dataclass
class SGDOptimizerConfig(OptimizerConfig):
    """OptimizerConfig with optimizer='sgd'."""

    optimizer: str = "sgd"

"""FP8 training without Transformer Engine: the recipe, and which layers run in FP8.

Mirrors `megatron.core.fp8_utils` where names overlap (`is_first_last_bf16_layer`). Megatron
trains in FP8 only through Transformer Engine (`fp8_autocast` around each transformer layer);
gigatron's own `ColumnParallelLinear` / `RowParallelLinear` run their three GEMMs (forward,
input gradient, weight gradient) through `torch._scaled_mm` with the scales a `torchao.float8`
recipe defines (`tensor_parallel/fp8_linear.py`). As in Megatron, only the linears inside
transformer layers run in FP8 (the output layer and embeddings stay in the model dtype), and
`first_last_layers_bf16` keeps the first / last layers out.

`torchao` is an optional extra (`pip install gigatron[fp8]`), imported only here and only when
`TransformerConfig.fp8` is set: `Fp8Recipe` is the one adapter to it.

Recipes (`fp8_recipe`): `delayed` (Megatron's default, Transformer Engine's `DelayedScaling`:
one scale per tensor from an amax history, `tensor_parallel/fp8_delayed.py`), and *current*
scaling (the scale comes from the tensor being cast, amax reduced over the TP group where the
tensor is split, so TP never changes the numbers):
- `tensorwise`: one scale per tensor (torchao's `tensorwise`, TE's `Float8CurrentScaling`);
- `rowwise`: one scale per row of each GEMM operand, powers of two (torchao's `rowwise`);
- `rowwise_with_gw_hp`: rowwise, weight gradient in high precision (torchao's).
`fp8` ('e4m3' | 'hybrid') picks the gradient format: e4m3 everywhere, or e5m2 for gradients.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

SUPPORTED_FP8_FORMATS = ("e4m3", "hybrid")
SUPPORTED_FP8_RECIPES = ("delayed", "tensorwise", "rowwise", "rowwise_with_gw_hp")
AMAX_COMPUTE_ALGOS = ("max", "most_recent")
# Megatron's choices gigatron does not implement, and why
UNSUPPORTED_FP8_RECIPES = {
    "mxfp8": "MXFP8 block scaling needs Blackwell GPUs and Transformer Engine",
    "blockwise": "128x128 block scaling needs Transformer Engine",
    "custom": "a custom quantizer factory needs Transformer Engine",
}

# GEMM operand roles, torchao's names: (cast-config attribute, gradient operand?)
_ROLES = {
    "input": ("cast_config_input", False),
    "weight": ("cast_config_weight", False),
    "grad_output": ("cast_config_grad_output", True),
    "input_for_grad_weight": ("cast_config_input_for_grad_weight", False),
    "weight_for_grad_input": ("cast_config_weight_for_grad_input", False),
    "grad_output_for_grad_weight": ("cast_config_grad_output_for_grad_weight", True),
}


@dataclass(frozen=True)
class Fp8Cast:
    """How one GEMM operand is cast: FP8 `dtype` (None: kept in high precision), one scale per
    tensor or per row of the operand (`rowwise`)."""

    dtype: torch.dtype | None
    rowwise: bool


@dataclass(frozen=True)
class Fp8Recipe:
    """What the FP8 linears need to know, resolved once from the config and torchao's recipe."""

    name: str
    """torchao recipe name (`fp8_recipe`)."""
    casts: dict[str, Fp8Cast]
    """role (`input`, `weight`, `grad_output`, `*_for_grad_*`) -> its cast."""
    fast_accum: dict[str, bool]
    """GEMM (`output`, `grad_input`, `grad_weight`) -> use_fast_accum (torchao's choice)."""
    round_scales_to_power_of_2: bool
    margin: int
    """`fp8_margin`: scales are divided by 2**margin (headroom above the current amax)."""
    ao: SimpleNamespace
    """torchao functions: `amax_to_scale`, `to_fp8_saturated`, `addmm_float8_unwrapped`."""
    delayed: bool = False
    """Delayed scaling: casts use each linear's `Fp8DelayedState` scales (per tensor)."""
    amax_history_len: int = 1
    """`fp8_amax_history_len` (delayed scaling)."""
    amax_compute_algo: str = "most_recent"
    """`fp8_amax_compute_algo` (delayed scaling): 'max' or 'most_recent'."""
    keep_input: bool = field(init=False)
    """forward's FP8 input serves the weight gradient (same per-tensor cast): saved instead of
    the input."""
    keep_weight: bool = field(init=False)
    """forward's FP8 weight serves the input gradient (same per-tensor cast)."""
    reuse_grad_output: bool = field(init=False)
    """the input gradient's FP8 dY serves the weight gradient (same per-tensor cast)."""
    hp_grad_weight: bool = field(init=False)
    """the weight gradient runs in the model dtype (one of its operands is not cast)."""

    def __post_init__(self):
        # Decided once here, not per call: the FP8 linear's Python stays plain attribute reads
        # (cheap for torch.compile to trace, one per linear and layer under a whole-model graph).
        c = self.casts
        flags = {
            "keep_input": _same_tensorwise(c["input"], c["input_for_grad_weight"]),
            "keep_weight": _same_tensorwise(c["weight"], c["weight_for_grad_input"]),
            "reuse_grad_output": _same_tensorwise(
                c["grad_output"], c["grad_output_for_grad_weight"]
            ),
            "hp_grad_weight": c["input_for_grad_weight"].dtype is None
            or c["grad_output_for_grad_weight"].dtype is None,
        }
        for name, value in flags.items():
            object.__setattr__(self, name, value)

    def cast(self, role: str) -> Fp8Cast:
        return self.casts[role]


def _same_tensorwise(c1: Fp8Cast, c2: Fp8Cast) -> bool:
    """Two casts of one tensor give the same FP8 bytes: the first serves for the second."""
    return c1 == c2 and c1.dtype is not None and not c1.rowwise


class _TorchaoImportNoise(logging.Filter):
    """Drops what importing torchao logs on every run and no user can act on: one "Failed to
    load .../torchao/_C_...so" line per GPU-only kernel library (mxfp8, cutlass), and torch's
    deprecation line about torchao registering an Enum with the pytree. Everything else passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith("Failed to load ") and "/_C" in message and ".so" in message:
            return False
        return not (record.name == "torch.utils._pytree" and "is an Enum subclass" in message)


@contextlib.contextmanager
def _quiet_torchao_import():
    """Attach _TorchaoImportNoise to the two loggers while torchao is first imported."""
    noise = _TorchaoImportNoise()
    loggers = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    for log in loggers:
        log.addFilter(noise)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(noise)


def _torchao():
    """torchao's float8 modules, or one clear error naming the extra."""
    try:
        with _quiet_torchao_import():
            from torchao.float8 import config as ao_config
            from torchao.float8 import float8_ops, float8_utils
    except ImportError as e:
        raise ImportError(
            f"FP8 training needs torchao: pip install 'gigatron[fp8]' (import failed: {e})"
        ) from None
    return ao_config, float8_ops, float8_utils


@functools.cache
def cpu_takes_rowwise_scales() -> bool:
    """Whether this torch's CPU `torch._scaled_mm` takes per-row / per-column scales (torch 2.13
    does; 2.11 takes per-tensor scales only), which the row-wise recipes need on CPU."""
    a = torch.zeros(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except (RuntimeError, TypeError):
        return False
    return True


def get_fp8_recipe(config) -> Fp8Recipe | None:
    """The recipe `config` (a TransformerConfig) asks for, or None when `config.fp8` is None."""
    if getattr(config, "fp8", None) is None:
        return None
    ao_config, float8_ops, float8_utils = _torchao()
    delayed = config.fp8_recipe == "delayed"
    # delayed scaling casts what the per-tensor recipe casts; only where the scales come from
    ao = ao_config.Float8LinearConfig.from_recipe_name(
        "tensorwise" if delayed else config.fp8_recipe
    )
    grad_dtype = torch.float8_e5m2 if config.fp8 == "hybrid" else torch.float8_e4m3fn
    casts = {}
    for role, (attr, is_grad) in _ROLES.items():
        cc = getattr(ao, attr)
        if cc.scaling_type is ao_config.ScalingType.DISABLED:
            casts[role] = Fp8Cast(None, False)
            continue
        dtype = grad_dtype if is_grad else torch.float8_e4m3fn
        rowwise = cc.scaling_granularity is ao_config.ScalingGranularity.AXISWISE
        casts[role] = Fp8Cast(dtype, rowwise)
    rowwise = any(c.rowwise for c in casts.values())
    if rowwise and not torch.cuda.is_available() and not cpu_takes_rowwise_scales():
        raise ValueError(
            f"--fp8-recipe {config.fp8_recipe} on CPU needs per-row scales in torch._scaled_mm, "
            f"which torch {torch.__version__} has on CUDA only: use --fp8-recipe tensorwise here"
        )
    if not config.fp8_wgrad:  # Megatron's fp8_wgrad=False: the weight gradient in high precision
        for role in ("input_for_grad_weight", "grad_output_for_grad_weight"):
            casts[role] = Fp8Cast(None, False)
    return Fp8Recipe(
        name=config.fp8_recipe,
        casts=casts,
        fast_accum={
            "output": ao.gemm_config_output.use_fast_accum,
            "grad_input": ao.gemm_config_grad_input.use_fast_accum,
            "grad_weight": ao.gemm_config_grad_weight.use_fast_accum,
        },
        round_scales_to_power_of_2=ao.round_scales_to_power_of_2,
        margin=int(config.fp8_margin),
        ao=SimpleNamespace(
            amax_to_scale=float8_utils.amax_to_scale,
            to_fp8_saturated=float8_utils.to_fp8_saturated,
            addmm_float8_unwrapped=float8_ops.addmm_float8_unwrapped,
        ),
        delayed=delayed,
        amax_history_len=int(getattr(config, "fp8_amax_history_len", 1)),
        amax_compute_algo=getattr(config, "fp8_amax_compute_algo", "most_recent"),
    )


def is_first_last_bf16_layer(config, layer_number: int) -> bool:
    """Does global layer `layer_number` (1-based) stay in high precision under
    `first_last_layers_bf16` (the first `num_layers_at_start_in_bf16` and the last
    `num_layers_at_end_in_bf16` layers)? Megatron's function of the same name takes a 0-based
    index; the rule is the same."""
    if not getattr(config, "first_last_layers_bf16", False):
        return False
    start, end = config.num_layers_at_start_in_bf16, config.num_layers_at_end_in_bf16
    return layer_number <= start or layer_number > config.num_layers - end


def set_fp8(module: torch.nn.Module, recipe: Fp8Recipe | None) -> None:
    """Run every `ColumnParallelLinear` / `RowParallelLinear` (and `GroupedMLP`) under `module`
    with `recipe` (None: in the model dtype). The transformer block calls this on each layer it
    builds (and, under delayed scaling, `tensor_parallel.fp8_delayed.attach_delayed_states`)."""
    for m in module.modules():
        if hasattr(m, "fp8_recipe"):
            m.fp8_recipe = recipe


def check_fp8_config(config) -> None:
    """ValueError for FP8 fields a TransformerConfig cannot run with (called by the config).
    fp8=False is None (off): Megatron tests the field for truth, and its tests pass False."""
    if config.fp8 is False:
        config.fp8 = None
    if config.fp8 is None:
        return
    if config.fp8 not in SUPPORTED_FP8_FORMATS:
        raise ValueError(f"fp8 ({config.fp8!r}) must be one of {SUPPORTED_FP8_FORMATS} or None")
    recipe = config.fp8_recipe
    if recipe in UNSUPPORTED_FP8_RECIPES:
        raise ValueError(
            f"fp8_recipe={recipe!r} is not supported by gigatron "
            f"({UNSUPPORTED_FP8_RECIPES[recipe]}); supported: {', '.join(SUPPORTED_FP8_RECIPES)} "
            "(--fp8-recipe tensorwise is Transformer Engine's current scaling)"
        )
    if recipe not in SUPPORTED_FP8_RECIPES:
        raise ValueError(
            f"fp8_recipe ({recipe!r}) must be one of {', '.join(SUPPORTED_FP8_RECIPES)}"
        )
    if not isinstance(config.fp8_margin, int) or config.fp8_margin < 0:
        raise ValueError(f"fp8_margin ({config.fp8_margin!r}) must be an int >= 0")
    _check_delayed(config)
    if config.first_last_layers_bf16:
        start, end = config.num_layers_at_start_in_bf16, config.num_layers_at_end_in_bf16
        if start < 0 or end < 0 or start + end > config.num_layers:
            raise ValueError(
                f"num_layers_at_start_in_bf16 ({start}) and num_layers_at_end_in_bf16 ({end}) "
                f"must be >= 0 and add up to at most num_layers ({config.num_layers})"
            )


def _check_delayed(config) -> None:
    """The delayed-scaling fields (checked whatever the recipe, as Megatron's TE recipe would)."""
    n = config.fp8_amax_history_len
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"fp8_amax_history_len ({n!r}) must be an int >= 1")
    if config.fp8_amax_compute_algo not in AMAX_COMPUTE_ALGOS:
        raise ValueError(
            f"fp8_amax_compute_algo ({config.fp8_amax_compute_algo!r}) must be one of "
            f"{AMAX_COMPUTE_ALGOS}"
        )
    if config.fp8_recipe != "delayed":
        return
    if config.first_last_layers_bf16:  # Megatron's rule
        raise ValueError(
            "first_last_layers_bf16=True: delayed scaling (fp8_recipe='delayed') does not "
            "support first / last layers in BF16"
        )
    bad = {"moe_act", "layernorm"} & set(config.recompute_modules or ())
    if config.recompute_granularity == "selective" and bad:  # Megatron's rule
        raise ValueError(
            f"recompute_modules {sorted(bad)}: delayed scaling (fp8_recipe='delayed') does not "
            "support moe_act and layernorm recompute for fp8"
        )
    if config.fp8_interval != 1:  # Megatron warns: Transformer Engine >= 1.8 ignores it
        warnings.warn(
            f"fp8_interval ({config.fp8_interval}) is deprecated and ignored (as by Transformer "
            "Engine >= 1.8): the scales are updated after every forward and backward",
            stacklevel=3,
        )


def get_fp8_context(config, layer_no: int = -1, is_init: bool = False):
    """Megatron's per-layer FP8 context (Transformer Engine's autocast): a no-op here.

    gigatron's linears choose FP8 themselves (`set_fp8`, with `first_last_layers_bf16`), so
    the context returned is `contextlib.nullcontext()` for every layer, as Megatron returns
    without Transformer Engine."""
    return contextlib.nullcontext()


def get_fp8_disabled_context(config, is_init: bool = False):
    """Megatron's context that turns FP8 off around a region: a no-op here (see above)."""
    return contextlib.nullcontext()


def is_float8tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is Transformer Engine's FP8 tensor (quantized param storage): always
    False, as Megatron answers without Transformer Engine (gigatron's FP8 linears keep
    high-precision params and cast inside the GEMM)."""
    return False


def is_nvfp4tensor(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is Transformer Engine's NVFP4 tensor: always False (see above)."""
    return False

"""Megatron's `megatron.core.extensions.transformer_engine` as it is without Transformer Engine.

Mirrors `megatron.core.extensions.transformer_engine` on a machine where `import
transformer_engine` fails, which is every gigatron machine:

- `HAVE_TE` is False, so Megatron-style code (and Megatron's tests) take their non-TE path;
- the TE layer classes (`TENorm`, `TELinear`, `TEColumnParallelLinear`, `TEDotProductAttention`,
  ...) exist, so their names import, and building one raises ImportError, as Megatron's do;
- the names Megatron sets to None without TE (`TEGroupedLinear`, `TEFusedMLP`, `te_general_gemm`,
  the fused MoE permute kernels, ...) are None.

The local layers (`gigatron.core.tensor_parallel`, `transformer`) are the CPU path: build
models with `get_gpt_layer_local_spec()` instead of a TE spec.
"""

from __future__ import annotations

from gigatron.core.utils import get_te_version, is_te_min_version, is_torch_min_version

__all__ = ["HAVE_TE", "get_te_version", "is_te_min_version", "is_torch_min_version"]

HAVE_TE = False
"""Transformer Engine is never importable from gigatron (stock PyTorch only)."""

_NO_TE = (
    "Transformer Engine is not installed: gigatron runs on stock PyTorch; build {name}'s "
    "local counterpart instead (get_gpt_layer_local_spec(), tensor_parallel.ColumnParallelLinear"
    " / RowParallelLinear, transformer.dot_product_attention.DotProductAttention)"
)


class _NeedsTransformerEngine:
    """Base of the TE layer names: building one raises ImportError, as Megatron's do without TE."""

    def __init__(self, *args, **kwargs) -> None:
        raise ImportError(_NO_TE.format(name=type(self).__name__))


class TENorm(_NeedsTransformerEngine):
    """TE LayerNorm / RMSNorm (gigatron: `transformer.torch_norm.WrappedTorchNorm`)."""

    def __new__(cls, *args, **kwargs):
        # Megatron's TENorm is a factory (its __new__ returns a TE module); fail the same way.
        raise ImportError(_NO_TE.format(name=cls.__name__))


class TELinear(_NeedsTransformerEngine):
    """TE Linear wrapper."""


class TELayerNormColumnParallelLinear(_NeedsTransformerEngine):
    """TE LayerNorm fused into a column-parallel linear."""


class TEColumnParallelLinear(TELinear):
    """TE column-parallel linear (gigatron: `tensor_parallel.ColumnParallelLinear`)."""


class TELMHeadColumnParallelLinear(TEColumnParallelLinear):
    """TE column-parallel output layer."""


class TERowParallelLinear(TELinear):
    """TE row-parallel linear (gigatron: `tensor_parallel.RowParallelLinear`)."""


class TEDotProductAttention(_NeedsTransformerEngine):
    """TE fused attention (gigatron: `transformer.dot_product_attention.DotProductAttention`)."""


class TEDelayedScaling(_NeedsTransformerEngine):
    """TE FP8 delayed-scaling recipe."""


class TECudaRNGStatesTracker(_NeedsTransformerEngine):
    """TE's CUDA RNG tracker (gigatron: `tensor_parallel.random.CudaRNGStatesTracker`)."""


def te_checkpoint(
    forward_func, distribute_saved_activations, get_rng_state_tracker, tp_group, *args, **kwargs
):
    """TE activation checkpointing: needs TE (gigatron: tensor_parallel.checkpoint)."""
    raise ImportError(_NO_TE.format(name="te_checkpoint"))


# Names Megatron sets to None when Transformer Engine (or a recent enough one) is missing.
TEGroupedLinear = None
TEColumnParallelGroupedLinear = None
TERowParallelGroupedLinear = None
TEFusedMLP = None
TEFusedMLPWithGroupedLinear = None
TEFusedResidualRMSNorm = None
TEActivationOp = None
SplitAlongDim = None
get_cpu_offload_context = None
fused_permute = None
fused_permute_with_probs = None
fused_sort_chunks_by_index = None
fused_sort_chunks_by_index_with_probs = None
fused_unpermute = None
fused_permute_and_pad_with_probs = None
te_parallel_cross_entropy = None
te_general_gemm = None
fused_topk_with_score_function = None
fused_compute_score_for_moe_aux_loss = None
fused_moe_aux_loss = None

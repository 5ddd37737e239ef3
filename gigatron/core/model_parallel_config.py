"""Parallelism and precision settings shared by every gigatron module.

Mirrors `megatron.core.model_parallel_config.ModelParallelConfig`: same field names, defaults and
post-init rules. Fields that exist in Megatron only for Transformer Engine / apex / userbuffer
kernels are accepted at their default and rejected with a clear error otherwise, so a setting is
never silently ignored.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gigatron.compat import megatron_only_fields

CROSS_ENTROPY_FUSION_IMPLS = ("native", "native_grad_in_forward")


@dataclass(kw_only=True)
class ModelParallelConfig(megatron_only_fields.MegatronOnlyParallelFields):
    """Parallel layout, initialisation, precision and pipeline hooks (Megatron's names).

    Megatron's fields for features gigatron lacks (userbuffer overlap knobs, CPU offloading, ...)
    come from `MegatronOnlyParallelFields` and must stay at their defaults.
    """

    # ---- parallel sizes ----
    tensor_model_parallel_size: int = 1
    """Number of ranks a layer's weights are split over (TP)."""
    pipeline_model_parallel_size: int = 1
    """Number of pipeline stages (PP)."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Model chunks per pipeline rank for the interleaved schedule (None = no interleaving)."""
    sequence_parallel: bool = False
    """Split LayerNorm/dropout activations along the sequence over the TP group."""
    context_parallel_size: int = 1
    """Number of ranks a sequence is split over for attention (CP)."""
    hierarchical_context_parallel_sizes: list[int] | None = None
    """Sizes of the hierarchical CP groups for cp_comm_type 'a2a+p2p'."""
    hybrid_context_parallel: bool = False
    """Per-sample dynamic CP group sizes (not supported)."""
    expert_model_parallel_size: int = 1
    """Number of ranks experts are distributed over (EP)."""
    expert_tensor_parallel_size: int | None = None
    """TP size inside each expert (None = tensor_model_parallel_size)."""
    moe_extended_tp: bool = False
    """Deprecated Megatron switch; kept for signature compatibility."""

    # ---- initialisation ----
    perform_initialization: bool = True
    """Run init_method on weights at construction (False leaves them uninitialised)."""
    use_cpu_initialization: bool = False
    """Build full weights on CPU and split them: identical full weights at every TP size."""

    # ---- precision ----
    fp16: bool = False
    """Train with fp16 parameters."""
    bf16: bool = False
    """Train with bf16 parameters."""
    params_dtype: torch.dtype = torch.float32
    """dtype parameters are allocated in."""
    timers: Any = None
    """Timers object used by the schedules (None disables timing)."""
    finalize_model_grads_func: Callable | None = None
    """Called by the schedules after the last backward to reduce gradients."""
    grad_scale_func: Callable | None = None
    """Scales the loss before backward (loss scaling for fp16)."""
    mtp_grad_scale_func: Callable | None = None
    """Returns the scale of the MTP losses' gradients (default: grad_scale_func's, else 1)."""
    no_sync_func: Callable | None = None
    """Context manager factory that disables gradient sync (gradient accumulation)."""
    grad_sync_func: Callable | None = None
    """Launches gradient sync of a model chunk (overlap with pipeline backward)."""
    param_sync_func: Callable | None = None
    """Launches parameter all-gather of a model chunk (overlap_param_gather)."""
    deterministic_mode: bool = False
    """Prefer deterministic kernels."""
    enable_autocast: bool = False
    """Run forward steps under torch.autocast."""
    autocast_dtype: torch.dtype | None = None
    """dtype for autocast (None = params_dtype)."""
    num_microbatches_with_partial_activation_checkpoints: int | None = None
    """Microbatches that recompute activations when recompute_num_layers is partial."""

    # ---- kernels and overlap ----
    gradient_accumulation_fusion: bool = False
    """Accumulate weight grads straight into main_grad (plain torch here, apex in Megatron)."""
    wgrad_gemm_accum_fp32: bool = True
    """gigatron-only, with gradient_accumulation_fusion: an fp32 main_grad with bf16/fp16
    activations takes dW from one cuBLAS GEMM accumulating into fp32 on CUDA (apex's
    `wgrad_gemm_accum_fp32`); False: a bf16/fp16 GEMM and one fp32 add (the older path, for A/B
    measurements; flag `--no-wgrad-gemm-accum-fp32`)."""
    async_tensor_model_parallel_allreduce: bool = True
    """Deprecated Megatron switch (Megatron's default True); accepted and unused."""
    tp_comm_overlap: bool = False
    """Overlap TP communication with GEMMs. Megatron: Transformer Engine userbuffers. gigatron,
    under sequence parallelism: column-parallel linears multiply this rank's own rows while the
    all-gather runs; row-parallel linears send each rank's block as soon as it is multiplied
    and multiply their own rows last (docs/tensor_parallel.md). No effect without SP."""
    cross_entropy_loss_fusion: bool = False
    """Use the fused vocab-parallel cross entropy."""
    cross_entropy_fusion_impl: str = "native"
    """Fused cross-entropy implementation. Megatron: 'native' or 'te'. gigatron: 'native' (output
    layer + vocab-parallel cross entropy in token chunks, logits recomputed in backward) or the
    gigatron-only 'native_grad_in_forward' (both gradients computed in forward: one logits
    matmul fewer; the per-token loss gradient must be proportional to the `loss_mask` given to
    GPTModel.forward, as Megatron's loss_func makes it; docs/performance.md). 'te' needs
    Transformer Engine."""

    # ---- pipeline ----
    pipeline_dtype: torch.dtype | None = None
    """dtype of tensors sent between pipeline stages (required when PP > 1)."""
    variable_seq_lengths: bool = False
    """Exchange tensor shapes before each p2p send (sequence length varies per microbatch)."""
    mtp_standalone: bool = False
    """MTP layers on a pipeline stage of their own (Megatron sets it from
    pipeline_model_parallel_layout): the stages exchange tensor shapes, as with
    variable_seq_lengths."""
    overlap_p2p_comm: bool = False
    """Overlap p2p communication with compute (interleaved schedule)."""
    batch_p2p_comm: bool = True
    """Batch the sends and receives of one step into one batch_isend_irecv."""
    batch_p2p_sync: bool = True
    """Synchronise after batched p2p (a workaround in Megatron; harmless here)."""
    use_ring_exchange_p2p: bool = False
    """Use ring-exchange p2p (custom PyTorch build only)."""
    deallocate_pipeline_outputs: bool = False
    """Free the data of sent pipeline outputs once sent (keeps only the autograd graph)."""
    defer_embedding_wgrad_compute: bool = False
    """Defer the embedding weight-gradient GEMM to the pipeline flush."""
    wgrad_deferral_limit: int = 0
    """Microbatches whose embedding wgrad may be deferred."""
    microbatch_group_size_per_vp_stage: int | None = None
    """Microbatches run on one virtual stage before switching (None = PP size)."""
    pipeline_timeline: Any = None
    """gigatron: a `pipeline_parallel.timeline.PipelineTimeline` that the schedules stamp each
    forward, backward and p2p exchange on while it is recording (None = off)."""
    cpu_offloading: bool = False
    """Offload activations to CPU (not supported)."""
    barrier_with_L1_time: bool = True
    """Barrier before timers record, for accurate timings."""

    def __post_init__(self) -> None:
        megatron_only_fields.check_config(self, "parallel")
        if self.cross_entropy_fusion_impl not in CROSS_ENTROPY_FUSION_IMPLS:
            raise ValueError(
                f"cross_entropy_fusion_impl={self.cross_entropy_fusion_impl!r} must be one of "
                f"{CROSS_ENTROPY_FUSION_IMPLS} in gigatron ('te' needs Transformer Engine)"
            )
        if self.cross_entropy_fusion_impl == "native_grad_in_forward" and not (
            self.cross_entropy_loss_fusion
        ):
            raise ValueError(
                "cross_entropy_fusion_impl='native_grad_in_forward' needs "
                "cross_entropy_loss_fusion=True (training flag --cross-entropy-loss-fusion): "
                "without it the plain cross entropy runs and the impl would be ignored"
            )
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.sequence_parallel and self.tensor_model_parallel_size <= 1:
            raise ValueError(
                "sequence_parallel=True requires tensor_model_parallel_size > 1 "
                f"(got {self.tensor_model_parallel_size})"
            )
        if self.pipeline_model_parallel_size > 1 and self.pipeline_dtype is None:
            raise ValueError(
                "pipeline_dtype must be set when pipeline_model_parallel_size "
                f"({self.pipeline_model_parallel_size}) > 1"
            )
        if (
            self.virtual_pipeline_model_parallel_size is not None
            and self.pipeline_model_parallel_size <= 1
        ):
            raise ValueError(
                "virtual_pipeline_model_parallel_size "
                f"({self.virtual_pipeline_model_parallel_size}) requires "
                f"pipeline_model_parallel_size > 1 (got {self.pipeline_model_parallel_size})"
            )
        if self.overlap_p2p_comm and self.batch_p2p_comm:
            raise ValueError("overlap_p2p_comm and batch_p2p_comm cannot both be True")
        if self.autocast_dtype is None:
            self.autocast_dtype = self.params_dtype
        if self.expert_tensor_parallel_size is None:
            self.expert_tensor_parallel_size = self.tensor_model_parallel_size
        if (
            self.expert_model_parallel_size > 1
            and self.tensor_model_parallel_size > 1
            and not self.sequence_parallel
        ):
            warnings.warn(
                "expert_model_parallel_size > 1 with tensor_model_parallel_size > 1 needs "
                "sequence_parallel=True to train MoE layers",
                stacklevel=2,
            )

"""`InferenceConfig` (mirrors `megatron.core.inference.config`), for what gigatron serves.

Megatron's config sizes its dynamic-batching engine: paged KV-cache blocks and buffers, CUDA
graphs, chunked prefill, prefix caching, speculative decoding, Mamba state, async scheduling.
gigatron's `generate(..., inference_config=cfg)` is static batching with a preallocated KV
cache, so of these fields it uses `max_requests` (prompts per batch, None: all at once) and
`max_sequence_length` (longest prompt + new tokens allowed); every other field is accepted at
Megatron's default only (`pg_collection` None: parallel_state's groups), and any other value
raises ValueError naming it (never silently ignored). Field names, order and defaults are
megatron-core 0.20's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass
from enum import StrEnum
from typing import Any

__all__ = [
    "AsyncScheduleMode",
    "CudaGraphSizingDistribution",
    "InferenceConfig",
    "KVCacheManagementMode",
    "PrefixCachingCoordinatorPolicy",
    "PrefixCachingEvictionPolicy",
]


class PrefixCachingEvictionPolicy(StrEnum):
    REF_ZERO = "ref_zero"
    LRU = "lru"


class PrefixCachingCoordinatorPolicy(StrEnum):
    LONGEST_PREFIX = "longest_prefix"
    FIRST_PREFIX_BLOCK = "first_prefix_block"
    LOAD_BALANCED = "load_balanced"


class KVCacheManagementMode(StrEnum):
    PERSIST = "persist"
    OFFLOAD = "offload"
    RECOMPUTE = "recompute"


class CudaGraphSizingDistribution(StrEnum):
    EXPONENTIAL = "exponential"
    LINEAR = "linear"


class AsyncScheduleMode(StrEnum):
    LEGACY = "legacy"
    ASYNC = "async"


_USED = {"max_sequence_length", "max_requests"}


@dataclass
class InferenceConfig:
    """Megatron's inference-engine config; see the module docstring for what gigatron uses."""

    block_size_tokens: int = 256
    buffer_size_gb: int = 20
    paused_buffer_size_gb: int | None = None
    mamba_inference_state_config: Any = None
    mamba_memory_ratio: float | None = None
    max_requests: int | None = None
    """Prompts per generation batch (None: every prompt in one batch)."""
    max_tokens: int | None = None
    unified_memory_level: int = 0
    kv_cache_management_mode: KVCacheManagementMode = KVCacheManagementMode.PERSIST
    num_cuda_graphs: int | None = None
    cuda_graph_mixed_prefill_count: int | None = 16
    cuda_graph_sizing_distribution: CudaGraphSizingDistribution = (
        CudaGraphSizingDistribution.EXPONENTIAL
    )
    use_cuda_graphs_for_non_decode_steps: bool = True
    cuda_graph_all_prefills: bool = False
    cuda_graph_max_tokens: int = 512
    static_kv_memory_pointers: bool = False
    max_sequence_length: int = 2560
    """Longest prompt + generated tokens allowed per sequence."""
    pg_collection: Any = None
    image_preprocessing_config: Any = None
    use_flashinfer_fused_rope: bool | None = False
    materialize_only_last_token_logits: bool = True
    enable_chunked_prefill: bool = False
    num_speculative_tokens: int = 0
    enable_prefix_caching: bool = False
    prefix_caching_eviction_policy: PrefixCachingEvictionPolicy = (
        PrefixCachingEvictionPolicy.REF_ZERO
    )
    prefix_caching_coordinator_policy: PrefixCachingCoordinatorPolicy = (
        PrefixCachingCoordinatorPolicy.LOAD_BALANCED
    )
    prefix_caching_routing_alpha: float = 0.5
    prefix_caching_mamba_gb: float | None = None
    track_paused_request_events: bool = False
    track_generated_token_events: bool = False
    metrics_writer: Any = None
    logging_step_interval: int = 0
    sampling_backend: str = "torch"
    offset_sampling_seed_by_dp_rank: bool = True
    async_sched_mode: AsyncScheduleMode = AsyncScheduleMode.LEGACY
    logprobs_mode: str = "raw_logprobs"
    request_metadata_types: list | None = None
    use_synchronous_zmq_collectives: bool = False
    disable_ep_consensus: bool = False
    ep_consensus_interval: int = 20
    verbose: InitVar[bool] = False

    def __post_init__(self, verbose: bool) -> None:
        if self.max_sequence_length < 1:
            raise ValueError(f"max_sequence_length ({self.max_sequence_length}) must be >= 1")
        if self.max_requests is not None and self.max_requests < 1:
            raise ValueError(f"max_requests ({self.max_requests}) must be >= 1 or None")
        for f in dataclasses.fields(self):
            if f.name in _USED:
                continue
            value = getattr(self, f.name)
            if value != f.default:
                raise ValueError(
                    f"InferenceConfig.{f.name}={value!r} is not supported by gigatron (its "
                    "generate is static batching without Megatron's dynamic engine); leave it "
                    f"at Megatron's default {f.default!r} (gigatron/core/inference/config.py)"
                )

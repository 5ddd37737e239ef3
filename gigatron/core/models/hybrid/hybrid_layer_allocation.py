"""Megatron's canonical path of the hybrid layer pattern; the code lives in
gigatron.core.ssm.mamba_hybrid_layer_allocation."""

from gigatron.core.ssm.mamba_hybrid_layer_allocation import (
    ParsedHybridPattern,
    Symbols,
    get_hybrid_layer_counts,
    get_hybrid_total_layer_count,
    get_hybrid_total_pipeline_segment_count,
    parse_hybrid_pattern,
    select_pipeline_segment,
    validate_segment_layers,
)

__all__ = [
    "ParsedHybridPattern",
    "Symbols",
    "get_hybrid_layer_counts",
    "get_hybrid_total_layer_count",
    "get_hybrid_total_pipeline_segment_count",
    "parse_hybrid_pattern",
    "select_pipeline_segment",
    "validate_segment_layers",
]

"""Legacy name of the static KV-cache context.

Mirrors `megatron.core.inference_params`: in Megatron Core 0.16 `InferenceParams` is
`StaticInferenceContext` (same constructor `(max_batch_size, max_sequence_length)`, same
`key_value_memory_dict`, `sequence_len_offset`, `batch_size_offset`).
"""

from gigatron.core.inference.contexts import StaticInferenceContext as InferenceParams

__all__ = ["InferenceParams"]

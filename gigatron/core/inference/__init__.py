"""Text generation: static KV cache, sampling, and a batched `generate` loop.

Mirrors the small static-batching part of `megatron.core.inference` (contexts,
sampling_params, the text-generation controller's sampling); see docs/generation.md.
"""

from gigatron.core.inference.contexts import BaseInferenceContext, StaticInferenceContext
from gigatron.core.inference.sampling_params import SamplingParams
from gigatron.core.inference.text_generation import GenerationResult, generate

__all__ = [
    "BaseInferenceContext",
    "GenerationResult",
    "SamplingParams",
    "StaticInferenceContext",
    "generate",
]

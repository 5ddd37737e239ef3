"""gigatron.core.models.hybrid: hybrid (Mamba-2 + attention) language models (mirrors
megatron.core.models.hybrid): HybridModel, HybridStack, the layer pattern, the layer specs."""

from gigatron.core.models.hybrid.hybrid_model import HybridModel

__all__ = ["HybridModel"]

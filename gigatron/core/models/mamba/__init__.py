"""gigatron.core.models.mamba: Megatron's deprecated names of the hybrid model (MambaModel)."""

from gigatron.core.models.hybrid.hybrid_model import HybridModel
from gigatron.core.models.mamba.mamba_model import MambaModel

__all__ = ["HybridModel", "MambaModel"]

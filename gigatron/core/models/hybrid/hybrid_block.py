"""Megatron's canonical path of the hybrid decoder; the code lives in gigatron.core.ssm.mamba_block
(the floor of the layers it builds)."""

from gigatron.core.ssm.mamba_block import (
    HybridStack,
    HybridStackSubmodules,
    MambaStack,
    MambaStackSubmodules,
)

__all__ = ["HybridStack", "HybridStackSubmodules", "MambaStack", "MambaStackSubmodules"]

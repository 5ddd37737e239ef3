"""MambaModel: Megatron's deprecated name of HybridModel, taking `mamba_stack_spec` for
`hybrid_stack_spec` (mirrors `megatron.core.models.mamba.mamba_model`)."""

from __future__ import annotations

from gigatron.core.models.hybrid.hybrid_model import HybridModel


class MambaModel(HybridModel):
    """HybridModel accepting the deprecated `mamba_stack_spec` keyword."""

    def __init__(self, *args, mamba_stack_spec=None, **kwargs):
        if mamba_stack_spec is not None:
            if "hybrid_stack_spec" in kwargs or len(args) >= 2:
                raise ValueError(
                    "Cannot specify both hybrid_stack_spec and mamba_stack_spec "
                    "(mamba_stack_spec is deprecated; use hybrid_stack_spec)"
                )
            kwargs["hybrid_stack_spec"] = mamba_stack_spec
        super().__init__(*args, **kwargs)

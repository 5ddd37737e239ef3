"""gigatron.core.ssm: state-space mixers of hybrid models (mirrors megatron.core.ssm).

`mamba_mixer` (Mamba-2: MambaMixer) over the plain-PyTorch scan in `ssd`; `utils` holds the
per-component TP slicing and split checkpoint entries any packed-projection mixer (a Gated
DeltaNet one included) can reuse.
"""

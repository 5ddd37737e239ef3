"""Opt-in compatibility shims (see `gigatron.compat.megatron`)."""

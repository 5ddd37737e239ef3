"""Megatron's `megatron.core.extensions`: third-party backends (Transformer Engine, Kitchen).

gigatron runs on stock PyTorch only, so these modules give what Megatron gives on a machine
without the backend: `HAVE_TE = False`, the TE layer classes raise ImportError when built, and
the optional TE kernels are None.
"""

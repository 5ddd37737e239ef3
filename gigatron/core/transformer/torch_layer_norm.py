"""Megatron's old import path for the torch norm wrapper (`WrappedTorchLayerNorm`)."""

from gigatron.core.transformer.torch_norm import WrappedTorchNorm

WrappedTorchLayerNorm = WrappedTorchNorm

__all__ = ["WrappedTorchLayerNorm"]

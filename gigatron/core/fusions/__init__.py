"""Fused-op entry points (mirrors megatron.core.fusions); gigatron runs them as plain torch ops."""

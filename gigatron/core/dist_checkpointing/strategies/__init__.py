"""Checkpoint format strategies (mirrors `megatron.core.dist_checkpointing.strategies`)."""

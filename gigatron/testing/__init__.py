"""Helpers for testing gigatron code on several CPU processes (gloo) or GPUs (NCCL)."""

from gigatron.testing.distributed import DistributedTestError, run_distributed

__all__ = ["DistributedTestError", "run_distributed"]

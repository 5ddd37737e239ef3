"""Checkpoint save / load throughput, gigatron against megatron-core's dist_checkpointing
(bench_ckpt.py).
"""

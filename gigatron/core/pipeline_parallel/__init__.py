"""Pipeline parallelism (mirrors `megatron.core.pipeline_parallel`): schedules, p2p, layer split."""

from gigatron.core.pipeline_parallel.schedules import get_forward_backward_func

__all__ = ["get_forward_backward_func"]

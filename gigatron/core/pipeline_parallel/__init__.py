"""Pipeline parallelism: schedules, p2p communication and the layer split (`megatron.core.pipeline_parallel`)."""

from gigatron.core.pipeline_parallel.schedules import get_forward_backward_func

__all__ = ["get_forward_backward_func"]

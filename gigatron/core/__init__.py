"""gigatron.core: Megatron Core's public API (`megatron.core`) in pure Python on PyTorch."""

import importlib

from gigatron import __version__

__all__ = ["__version__"]  # extended below with the lazily loaded names

# Submodules load on first use so `import gigatron.core` stays cheap and one package's import
# error cannot break the others.
_LAZY = {
    "parallel_state": "gigatron.core.parallel_state",
    "mpu": "gigatron.core.parallel_state",
    "tensor_parallel": "gigatron.core.tensor_parallel",
    "ModelParallelConfig": "gigatron.core.model_parallel_config:ModelParallelConfig",
    "DistributedDataParallel": "gigatron.core.distributed:DistributedDataParallel",
    "DistributedDataParallelConfig": "gigatron.core.distributed:DistributedDataParallelConfig",
    "Timers": "gigatron.core.timers:Timers",
    "InferenceParams": "gigatron.core.inference_params:InferenceParams",
    "utils": "gigatron.core.utils",
    "dist_checkpointing": "gigatron.core.dist_checkpointing",
    "pipeline_parallel": "gigatron.core.pipeline_parallel",
    "optimizer": "gigatron.core.optimizer",
    "get_megatron_optimizer": "gigatron.core.optimizer:get_megatron_optimizer",
    "OptimizerConfig": "gigatron.core.optimizer:OptimizerConfig",
    "safe_globals": "gigatron.core.safe_globals",
    "register_safe_globals": "gigatron.core.safe_globals:register_safe_globals",
    "safe_load_from_bytes": "gigatron.core.safe_globals:safe_load_from_bytes",
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gigatron.core' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


__all__ += list(_LAZY)

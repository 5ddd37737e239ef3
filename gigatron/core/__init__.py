"""gigatron.core: Megatron Core's public API (`megatron.core`) in pure Python on PyTorch."""

import importlib

from gigatron import __version__

__all__ = ["__version__", "parallel_state", "mpu", "tensor_parallel", "ModelParallelConfig"]

# Submodules load on first use so `import gigatron.core` stays cheap and one package's import
# error cannot break the others.
_LAZY = {
    "parallel_state": "gigatron.core.parallel_state",
    "mpu": "gigatron.core.parallel_state",
    "tensor_parallel": "gigatron.core.tensor_parallel",
    "ModelParallelConfig": "gigatron.core.model_parallel_config:ModelParallelConfig",
    "DistributedDataParallel": "gigatron.core.distributed:DistributedDataParallel",
}


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'gigatron.core' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module

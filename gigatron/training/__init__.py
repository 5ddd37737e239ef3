"""gigatron.training: the parts of `megatron.training` that users script against.

`from gigatron.training import get_args, print_rank_0, pretrain` works as with Megatron.
"""

import importlib

_LAZY = {
    "get_args": "gigatron.training.global_vars",
    "get_timers": "gigatron.training.global_vars",
    "get_tokenizer": "gigatron.training.global_vars",
    "get_tensorboard_writer": "gigatron.training.global_vars",
    "get_wandb_writer": "gigatron.training.global_vars",
    "set_args": "gigatron.training.global_vars",
    "print_rank_0": "gigatron.training.utils",
    "print_rank_last": "gigatron.training.utils",
    "is_last_rank": "gigatron.training.utils",
    "initialize_megatron": "gigatron.training.initialize",
    "pretrain": "gigatron.training.training",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gigatron.training' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

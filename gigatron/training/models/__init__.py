"""Model configs and builders of the training loop (mirrors `megatron.training.models`).

gigatron has the base layer (`ModelConfig`, `ModelBuilder`, `Serializable`, `compose_hooks`);
Megatron's GPT / hybrid builders and `dist_utils` are not provided yet.
"""

from gigatron.training.models.base import ModelBuilder, ModelConfig, Serializable, compose_hooks

__all__ = ["ModelBuilder", "ModelConfig", "Serializable", "compose_hooks"]

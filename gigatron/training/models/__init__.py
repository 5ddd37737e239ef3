"""Model configs of Megatron 0.20's `megatron.training.models` (the `Serializable` protocol)."""

from gigatron.training.models.base import Serializable

__all__ = ["Serializable"]

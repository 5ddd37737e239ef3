"""T5 encoder-decoder (mirrors `megatron.core.models.T5`)."""

from gigatron.core.models.T5.t5_model import T5Model

__all__ = ["T5Model"]

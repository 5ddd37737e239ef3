"""GPT models (mirrors megatron.core.models.gpt)."""

from gigatron.core.models.gpt.gpt_model import GPTModel

__all__ = ["GPTModel"]

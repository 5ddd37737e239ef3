"""Embeddings shared by the model families (mirrors megatron.core.models.common.embeddings)."""

from gigatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from gigatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

__all__ = ["RotaryEmbedding", "apply_rotary_pos_emb"]

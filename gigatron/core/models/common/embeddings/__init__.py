"""Embeddings shared by the model families (mirrors megatron.core.models.common.embeddings)."""

from gigatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
from gigatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from gigatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
    YarnRotaryEmbedding,
    _yarn_get_mscale,
)

__all__ = ["RotaryEmbedding", "YarnRotaryEmbedding", "_yarn_get_mscale", "apply_rotary_pos_emb"]

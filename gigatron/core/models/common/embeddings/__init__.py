"""Embeddings shared by the model families (mirrors megatron.core.models.common.embeddings).

RoPE lives in `gigatron.core.transformer.rope` (the attention modules apply it, and imports point
down only); Megatron's paths `...embeddings.rope_utils`, `.rotary_pos_embedding` and
`.yarn_rotary_pos_embedding` are those very modules (same objects, for `monkeypatch` too).
"""

import sys

from gigatron.core.transformer.rope import (
    rope_utils,
    rotary_pos_embedding,
    yarn_rotary_pos_embedding,
)
from gigatron.core.transformer.rope.rope_utils import apply_rotary_pos_emb
from gigatron.core.transformer.rope.rotary_pos_embedding import RotaryEmbedding
from gigatron.core.transformer.rope.yarn_rotary_pos_embedding import (
    YarnRotaryEmbedding,
    _yarn_get_mscale,
)

for _module in (rope_utils, rotary_pos_embedding, yarn_rotary_pos_embedding):
    sys.modules[f"{__name__}.{_module.__name__.rpartition('.')[2]}"] = _module

__all__ = ["RotaryEmbedding", "YarnRotaryEmbedding", "_yarn_get_mscale", "apply_rotary_pos_emb"]

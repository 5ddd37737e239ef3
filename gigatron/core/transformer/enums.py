"""Model, layer, attention-type and mask-type enums (mirrors `megatron.core.transformer.enums`)."""

import enum


class ModelType(enum.Enum):
    """Model type: GPT/BERT-style models are `encoder_or_decoder`."""

    encoder_or_decoder = 1

    @property
    def encoder_and_decoder(self):
        raise ValueError(
            "ModelType.encoder_and_decoder is deprecated in Megatron Core; use encoder_or_decoder"
        )


class LayerType(enum.Enum):
    """Kinds of pipeline-layout entries."""

    embedding = 1
    loss = 2
    encoder = 3
    decoder = 4
    mtp = 5


class AttnType(enum.Enum):
    """Self- or cross-attention."""

    self_attn = 1
    cross_attn = 2


class AttnMaskType(enum.Enum):
    """How the attention mask is interpreted (causal builds its own mask when none is given)."""

    padding = 1
    causal = 2
    no_mask = 3
    padding_causal = 4
    arbitrary = 5
    causal_bottom_right = 6


class AttnBackend(enum.Enum):
    """Core-attention backend: gigatron maps local/unfused to DotProductAttention and
    flash/fused/auto to the SDPA adapter (same numerics)."""

    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5

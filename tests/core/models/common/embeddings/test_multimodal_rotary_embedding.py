"""MultimodalRotaryEmbedding (mRoPE): each channel section reads its own position stream."""

import pytest
import torch

from gigatron.core.models.common.embeddings.rotary_pos_embedding import (
    MultimodalRotaryEmbedding,
    RotaryEmbedding,
)


def test_equal_streams_give_plain_rope_angles():
    mrope = MultimodalRotaryEmbedding(kv_channels=16, rotary_percent=1.0)
    pos = torch.arange(6.0).expand(3, 2, 6)  # [3, b, s], the same positions in every stream
    out = mrope(pos, mrope_section=[2, 3, 3])
    assert out.shape == (6, 2, 1, 16) and out.dtype == torch.float32
    plain = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, use_cpu_initialization=True)(6)
    torch.testing.assert_close(out, plain.expand(6, 2, 1, 16))


def test_sections_read_their_streams():
    mrope = MultimodalRotaryEmbedding(kv_channels=8, rotary_percent=1.0, rotary_base=1)
    # base 1: every inv_freq is 1, so an angle equals the position it came from.
    t, h, w = torch.full((1, 1, 2), 1.0), torch.full((1, 1, 2), 2.0), torch.full((1, 1, 2), 3.0)
    out = mrope(torch.cat([t, h, w]), mrope_section=[1, 2, 1])
    expected = torch.tensor([1.0, 2.0, 2.0, 3.0] * 2)
    torch.testing.assert_close(out[0, 0, 0], expected)
    inter = MultimodalRotaryEmbedding(8, 1.0, rotary_interleaved=True, rotary_base=1)
    out = inter(torch.cat([t, h, w]), mrope_section=[1, 2, 1])
    torch.testing.assert_close(out[1, 0, 0], torch.tensor([1.0, 1, 2, 2, 2, 2, 3, 3]))


def test_sections_must_cover_the_channel_pairs():
    mrope = MultimodalRotaryEmbedding(kv_channels=8, rotary_percent=1.0)
    with pytest.raises(ValueError, match=r"mrope_section \(\[1, 1, 1\]\)"):
        mrope(torch.zeros(3, 1, 2), mrope_section=[1, 1, 1])

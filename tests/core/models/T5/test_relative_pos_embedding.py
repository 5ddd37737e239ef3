"""RelativePositionEmbedding (Megatron's T5 relative position bias) equals transformers'
T5Attention.compute_bias for the same table, bidirectional (encoder) and causal (decoder), with
sequences longer than max_distance so the log-spaced and clamped buckets are exercised."""

import pytest
import torch

from gigatron.core.models.T5.relative_pos_embedding import RelativePositionEmbedding

transformers = pytest.importorskip("transformers")
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402


@pytest.mark.parametrize("is_decoder", [False, True])
def test_bias_matches_transformers_t5(is_decoder):
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        d_model=16, d_kv=4, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=20, is_decoder=is_decoder,
    )  # fmt: skip
    hf = T5Attention(cfg, has_relative_attention_bias=True)
    ours = RelativePositionEmbedding(
        bidirectional=not is_decoder,
        init_method=torch.nn.init.normal_,
        num_attention_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
    )
    with torch.no_grad():
        hf.relative_attention_bias.weight.copy_(ours.relative_attention_bias.weight)
        ref = hf.compute_bias(30, 30)
        bias = ours(30, 30)
    assert bias.shape == (1, 4, 30, 30)
    torch.testing.assert_close(bias, ref, rtol=0, atol=0)
    # the 30-token sequence reaches the last (clamped, log-spaced) bucket
    offsets = torch.arange(30)[None] - torch.arange(30)[:, None]
    buckets = ours._relative_position_bucket(offsets, not is_decoder, 8, 20)
    assert int(buckets.max()) == 7 and len(torch.unique(buckets)) >= 7

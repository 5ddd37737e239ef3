"""A float or integer attention mask is refused in one line naming the dtype and Megatron's
convention (bool, True = masked out; None for causal), at the model, the block and the
attention layer; bool masks and None run."""

import pytest
import torch

from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()

B, S, V = 2, 8, 32


def _gpt() -> GPTModel:
    config = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True
    )
    return GPTModel(config, get_gpt_layer_local_spec(), V, S)


def _inputs():
    tokens = torch.randint(0, V, (B, S))
    return tokens, torch.arange(S).expand(B, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_gpt_model_refuses_a_non_bool_mask_naming_the_convention(dtype):
    tokens, positions = _inputs()
    mask = torch.ones(B, 1, S, S, dtype=dtype)  # what tutorials build: 1 = attend
    with pytest.raises(TypeError) as err:
        _gpt()(tokens, positions, mask, labels=tokens)
    message = str(err.value)
    assert "\n" not in message
    for word in (str(dtype), "bool", "True where attention is masked out", "None for causal",
                 "attention_mask < 0.5"):  # fmt: skip
        assert word in message, (word, message)


def test_block_and_attention_refuse_a_float_mask():
    model = _gpt()
    hidden = torch.randn(S, B, 16)
    mask = torch.ones(B, 1, S, S)
    with pytest.raises(TypeError, match="attention_mask has dtype torch.float32"):
        model.decoder(hidden, mask)
    with pytest.raises(TypeError, match="attention_mask has dtype torch.float32"):
        model.decoder.layers[0].self_attention(hidden, mask)


def test_bool_masks_and_none_run():
    tokens, positions = _inputs()
    model = _gpt().eval()  # no dropout: two forwards compare
    causal = torch.ones(S, S, dtype=torch.bool).triu(1).expand(B, 1, S, S)
    with torch.no_grad():
        with_mask = model(tokens, positions, causal, labels=tokens)
        without = model(tokens, positions, None, labels=tokens)
    torch.testing.assert_close(with_mask, without)

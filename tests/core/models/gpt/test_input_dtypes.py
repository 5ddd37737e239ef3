"""GPTModel refuses float token ids, positions and labels in one line naming the argument (torch
says "Expected tensor for argument #1 'indices'" for either of the first two, and "gather():
Expected dtype int32/int64 for index" deep in the loss for labels)."""

import pytest
import torch

from gigatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.transformer.transformer_config import TransformerConfig
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures()

B, S, V = 2, 8, 32


@pytest.mark.parametrize("name", ["input_ids", "position_ids", "labels"])
def test_float_ids_are_refused_naming_the_argument(name):
    config = TransformerConfig(
        num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True
    )
    model = GPTModel(config, get_gpt_layer_local_spec(), V, S)
    tokens = torch.randint(0, V, (B, S))
    inputs = {"input_ids": tokens, "position_ids": torch.arange(S).expand(B, -1), "labels": tokens}
    inputs[name] = inputs[name].float()
    with pytest.raises(TypeError) as err:
        model(inputs["input_ids"], inputs["position_ids"], None, labels=inputs["labels"])
    message = str(err.value)
    assert message.startswith(f"{name} has dtype torch.float32") and "\n" not in message
    assert "integer" in message and "torch.long" in message, message

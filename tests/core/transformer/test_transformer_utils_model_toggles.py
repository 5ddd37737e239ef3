"""transformer.utils: is_layer_window_attention, set_model_config_attribute,
set_model_to_sequence_parallel (Megatron 0.20 helpers)."""

import types

import pytest
import torch

from gigatron.core.transformer import utils


@pytest.mark.parametrize(
    "window, skip, layer, expected",
    [
        (None, None, 1, False),
        ((4, 0), None, 3, True),
        ((4, 0), 2, 1, True),
        ((4, 0), 2, 2, False),  # every 2nd layer is full attention
        ((4, 0), [1, 0, 1], 2, False),
        ((4, 0), [1, 0, 2], 3, True),
    ],
)
def test_is_layer_window_attention(window, skip, layer, expected):
    assert utils.is_layer_window_attention(window, skip, layer) is expected


def test_is_layer_window_attention_rejects_other_skip_types():
    with pytest.raises(ValueError, match="window_attn_skip_freq"):
        utils.is_layer_window_attention((4, 0), "every-other", 1)


class _Layer(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.sequence_parallel = False
        self.proj = torch.nn.Linear(2, 2)


class _Model(torch.nn.Module):
    def __init__(self, position_embedding_type="rope"):
        super().__init__()
        self.config = types.SimpleNamespace(sequence_parallel=False, flag=0)
        self.position_embedding_type = position_embedding_type
        self.reduce_scatter_embeddings = False
        own = types.SimpleNamespace(sequence_parallel=False, flag=0)
        self.layers = torch.nn.ModuleList([_Layer(self.config), _Layer(own)])


def test_set_model_config_attribute_reaches_layer_configs_through_wrappers():
    model = _Model()
    wrapper = types.SimpleNamespace(module=model, config=model.config)
    utils.set_model_config_attribute(wrapper, "flag", 7)
    assert model.config.flag == 7 and model.layers[1].config.flag == 7


def test_set_model_to_sequence_parallel_flips_every_attribute_and_respects_exclusions():
    model = _Model()
    utils.set_model_to_sequence_parallel(model, set_to=True, exclude_modules=[model.layers[1]])
    assert model.config.sequence_parallel is True
    assert model.layers[0].sequence_parallel is True
    assert model.layers[1].sequence_parallel is False
    assert model.reduce_scatter_embeddings is True
    utils.set_model_to_sequence_parallel(model, set_to=False)
    assert model.layers[0].sequence_parallel is False


def test_learned_absolute_positions_keep_reduce_scatter_embeddings():
    model = _Model(position_embedding_type="learned_absolute")
    utils.set_model_to_sequence_parallel(model, set_to=True)
    assert model.reduce_scatter_embeddings is False

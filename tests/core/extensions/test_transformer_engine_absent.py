"""`gigatron.core.extensions`: Megatron's TE module as it is without Transformer Engine."""

import pytest

from gigatron.core.extensions import transformer_engine as te_ext
from gigatron.core.extensions.transformer_engine_spec_provider import TESpecProvider
from gigatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear


def test_have_te_is_false_and_optional_kernels_are_none():
    assert te_ext.HAVE_TE is False
    assert te_ext.te_general_gemm is None
    assert te_ext.TEColumnParallelGroupedLinear is None
    assert te_ext.TEFusedMLP is None
    assert not te_ext.is_te_min_version("1.0.0")


@pytest.mark.parametrize(
    "cls",
    [
        te_ext.TENorm,
        te_ext.TELinear,
        te_ext.TEColumnParallelLinear,
        te_ext.TERowParallelLinear,
        te_ext.TELayerNormColumnParallelLinear,
        te_ext.TEDotProductAttention,
    ],
)
def test_building_a_te_layer_raises_import_error_naming_it(cls):
    with pytest.raises(ImportError, match=cls.__name__):
        cls(config=None, hidden_size=32)


def test_te_checkpoint_raises_import_error():
    with pytest.raises(ImportError, match="Transformer Engine"):
        te_ext.te_checkpoint(lambda x: x, False, None, None)


def test_te_spec_provider_builds_and_names_the_te_classes():
    backend = TESpecProvider()
    assert backend.column_parallel_linear() is te_ext.TEColumnParallelLinear
    assert backend.row_parallel_linear() is te_ext.TERowParallelLinear
    assert backend.core_attention() is te_ext.TEDotProductAttention
    assert backend.fuse_layernorm_and_linear() is True
    assert backend.activation_func() is None


def test_te_spec_provider_experts_fall_back_to_local_linears():
    with pytest.warns(UserWarning, match="SequentialMLP"):
        experts = TESpecProvider().grouped_mlp_modules(moe_use_grouped_gemm=True)
    sub = experts.keywords["submodules"]
    assert (sub.linear_fc1, sub.linear_fc2) == (ColumnParallelLinear, RowParallelLinear)

"""Megatron's own value rules run before gigatron refuses a field it does not implement."""

import pytest

from gigatron.core.transformer.transformer_config import TransformerConfig

BASE = dict(num_layers=1, hidden_size=32, num_attention_heads=4)


@pytest.mark.parametrize("n", [0, -1])
def test_non_positive_gdp_num_householder_gets_megatrons_value_error(n):
    with pytest.raises(ValueError, match="gdp_num_householder must be positive"):
        TransformerConfig(**BASE, gdp_num_householder=n)


def test_legal_but_unimplemented_value_is_still_refused():
    with pytest.raises(ValueError, match="not supported by gigatron"):
        TransformerConfig(**BASE, gdp_num_householder=5)


def test_mxfp8_wire_dtypes_need_the_ncclep_flex_dispatcher():
    with pytest.raises(ValueError, match="require the 'ncclep' flex"):
        TransformerConfig(**BASE, moe_dispatch_fwd_dtype="mxfp8")


def test_mxfp8_wire_dtypes_need_op_fuser_and_grouped_gemm():
    with pytest.raises(ValueError, match="require BOTH"):
        TransformerConfig(
            **BASE,
            num_moe_experts=2,
            moe_token_dispatcher_type="flex",
            moe_flex_dispatcher_backend="ncclep",
            moe_combine_bwd_dtype="mxfp8",
        )


def test_ep_overlap_with_two_mtp_layers_is_megatrons_assertion():
    with pytest.raises(AssertionError, match="MTP supports at most one layer"):
        TransformerConfig(**BASE, overlap_moe_expert_parallel_comm=True, mtp_num_layers=2)


def test_unknown_batch_invariant_backend_is_megatrons_assertion():
    with pytest.raises(AssertionError, match="Unknown batch_invariant_backend 'te-native'"):
        TransformerConfig(**BASE, batch_invariant_mode=True, batch_invariant_backend="te-native")

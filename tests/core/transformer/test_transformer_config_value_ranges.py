"""Float fields of TransformerConfig / MLATransformerConfig whose NaN or out-of-range value
switched a feature off silently (a NaN or negative aux-loss coefficient: no load balancing) or
made NaN numbers later are refused at construction, one ValueError naming the field, the value
and the rule."""

import math

import pytest

from gigatron.core.transformer._config_checks import FLOAT_FIELDS
from gigatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4)
MLA_ONLY = {"rotary_base", "rotary_percent", "rotary_scaling_factor", "beta_fast", "beta_slow",
            "mscale", "mscale_all_dim"}  # fmt: skip
# a value outside each rule (NaN is outside every one)
OUTSIDE = {"finite": math.inf, ">= 0": -0.5, "> 0": 0.0, "in [0, 1)": 1.0, "in (0, 1]": 0.0}


def _build(name, value):
    cls = MLATransformerConfig if name in MLA_ONLY else TransformerConfig
    kw = dict(BASE, num_moe_experts=4) if name.startswith("moe_") else dict(BASE)
    return cls(**kw, **{name: value})


@pytest.mark.parametrize("name", sorted(FLOAT_FIELDS))
def test_nan_and_out_of_range_values_are_refused_naming_the_field(name):
    rule = FLOAT_FIELDS[name]
    for bad in (math.nan, OUTSIDE[rule]):
        with pytest.raises(ValueError, match=rf"^{name} \({bad!r}\) must be a finite number"):
            _build(name, bad)


@pytest.mark.parametrize(
    "name, value",
    [("moe_aux_loss_coeff", -0.01), ("moe_aux_loss_coeff", math.nan), ("moe_z_loss_coeff", -1e-3),
     ("moe_router_topk_scaling_factor", math.nan), ("rotary_scaling_factor", math.nan),
     ("mscale", math.nan), ("mscale_all_dim", -1.0), ("moe_input_jitter_eps", math.nan)],
)  # fmt: skip
def test_the_reported_values_are_refused(name, value):
    with pytest.raises(ValueError, match=name):
        _build(name, value)


def test_a_list_of_coefficients_is_checked_entrywise_and_good_values_pass():
    with pytest.raises(ValueError, match=r"moe_aux_loss_coeff\[1\] \(nan\) must be a finite"):
        TransformerConfig(**BASE, num_moe_experts=4,
                          moe_router_load_balancing_type=["aux_loss", "seq_aux_loss"],
                          moe_aux_loss_coeff=[0.01, math.nan])  # fmt: skip
    cfg = TransformerConfig(**BASE, num_moe_experts=4, moe_aux_loss_coeff=0.0,
                            moe_z_loss_coeff=1e-3, moe_input_jitter_eps=0.01,
                            moe_router_topk_scaling_factor=2.5)  # fmt: skip
    assert cfg.moe_z_loss_coeff == 1e-3
    mla = MLATransformerConfig(**BASE, mscale=0.707, mscale_all_dim=0.707)
    assert mla.mscale_all_dim == 0.707


def test_numpy_scalars_and_0d_tensors_are_numbers():
    import numpy
    import torch

    for good in (numpy.float32(0.5), numpy.int64(1), torch.tensor(0.5)):
        _build("layernorm_epsilon", good)
    for bad in (numpy.float32("nan"), torch.tensor(-1.0), torch.tensor([0.5]), True):
        with pytest.raises(ValueError, match="layernorm_epsilon"):
            _build("layernorm_epsilon", bad)

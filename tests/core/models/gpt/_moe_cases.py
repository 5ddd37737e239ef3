"""The MoE GPT configuration and the expert-name mapping shared by the expert-parallel GPT tests
(test_moe_expert_parallel.py, test_moe_pipeline.py): megatron.core.transformer.moe through
GPTModel."""

import torch.nn.functional as F

from gigatron.core import parallel_state as ps
from gigatron.core.transformer.transformer_config import TransformerConfig

E = 4  # experts


def moe_gpt_config(num_layers, **layout):
    """A hidden-32 SwiGLU / RMSNorm TransformerConfig with E experts, top-2 alltoall routing,
    MoE on every second layer, aux (0.05) and z (1e-3) losses, no dropout, CPU init;
    `layout`: the parallel sizes (expert_model_parallel_size=, pipeline_model_parallel_size=...)."""
    return TransformerConfig(
        num_layers=num_layers,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=48,
        num_moe_experts=E,
        moe_router_topk=2,
        moe_layer_freq=2,
        moe_aux_loss_coeff=0.05,
        moe_z_loss_coeff=1e-3,
        moe_token_dispatcher_type="alltoall",
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        **layout,
    )


def global_expert_name(name, ep):
    """`name` with a local expert index ('...local_experts.<i>...') replaced by the global one of
    this EP rank (rank * E / ep + i), as the EP = 1 model names it; other names unchanged."""
    if ".local_experts." not in name:
        return name
    head, rest = name.split(".local_experts.")
    i, tail = rest.split(".", 1)
    e = ps.get_expert_model_parallel_rank() * (E // ep) + int(i)
    return f"{head}.local_experts.{e}.{tail}"

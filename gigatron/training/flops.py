"""FLOPs of one training step for the actual architecture, and MFU.

Counts matmul FLOPs only (2 per multiply-add), forward + backward (backward = 2 x forward), no
recompute, full (not causally halved) attention scores: the Megatron-LM paper's convention, so
for a plain GPT it equals `72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))`, the formula the anchor
benchmarks use. GQA (fewer K/V heads), SwiGLU (three MLP matrices) and MoE (top-k routed experts
plus shared experts and the router) are counted as built.

    per token, per layer (multiply-adds):
      attention  h·(q + 2·kv_groups·d) + q·h     q = heads·d, d = kv_channels
      scores     2·s·q                           QKᵀ and PV
      mlp        m·h·f·k  (+ m·h·f_shared)       m = 3 with GLU else 2, k = top-k (1 dense)
      router     h·E                             MoE only
    per token, once: logits h·V
    step FLOPs = 6 · tokens · (sum of the above)
"""

from __future__ import annotations

from gigatron.training.utils import args_by_name

FORMULA = (
    "6 * tokens * [layers * (h*(q + 2*g*d) + q*h + 2*s*q + m*h*f*k + m*h*f_shared + h*E) + h*V]"
)

# Dense bf16 peak per GPU (datasheet), used for MFU. CPU has no meaningful peak here.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
}


def flops_per_token(
    *,
    num_layers: int,
    hidden_size: int,
    seq_length: int,
    vocab_size: int,
    num_attention_heads: int,
    kv_channels: int | None = None,
    num_query_groups: int | None = None,
    ffn_hidden_size: int | None = None,
    gated_linear_unit: bool = False,
    num_experts: int | None = None,
    moe_router_topk: int = 1,
    moe_ffn_hidden_size: int | None = None,
    moe_shared_expert_intermediate_size: int | None = None,
) -> float:
    """Training FLOPs (fwd + bwd) for one token of a sequence of `seq_length`."""
    h, s = hidden_size, seq_length
    d = kv_channels or h // num_attention_heads
    q = num_attention_heads * d
    g = num_query_groups or num_attention_heads
    m = 3 if gated_linear_unit else 2
    ffn = ffn_hidden_size or 4 * h
    attention = h * (q + 2 * g * d) + q * h + 2 * s * q
    if num_experts:
        f = moe_ffn_hidden_size or ffn
        mlp = m * h * f * moe_router_topk + h * num_experts
        if moe_shared_expert_intermediate_size:
            mlp += m * h * moe_shared_expert_intermediate_size
    else:
        mlp = m * h * ffn
    return 6.0 * (num_layers * (attention + mlp) + h * vocab_size)


def num_floating_point_operations(args, batch_size: int) -> float:
    """FLOPs of one step over `batch_size` sequences, from Megatron-style `args`."""
    per_token = flops_per_token(
        **args_by_name(
            args,
            "num_layers hidden_size seq_length num_attention_heads kv_channels num_query_groups "
            "ffn_hidden_size num_experts moe_router_topk",
        ),
        vocab_size=args.padded_vocab_size,
        gated_linear_unit=args.swiglu,
        moe_ffn_hidden_size=getattr(args, "moe_ffn_hidden_size", None),
        moe_shared_expert_intermediate_size=getattr(
            args, "moe_shared_expert_intermediate_size", None
        ),
    )
    return per_token * batch_size * args.seq_length


def device_peak_flops(device_name: str | None = None) -> float | None:
    """Datasheet dense bf16 peak of the current GPU, or None when unknown (CPU included)."""
    if device_name is None:
        import torch

        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    for key, value in PEAK_FLOPS.items():
        if key in device_name:
            return value
    return None

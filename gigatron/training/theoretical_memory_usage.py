"""Megatron's closed-form estimate of weight + optimizer memory per GPU
(mirrors `megatron.training.theoretical_memory_usage.compute_weight_and_optimizer_memory`).

Parameters are split by how a rank holds them: TP-sharded (attention, dense MLP, shared
experts, embedding: / TP), replicated (norms, router, latent projections, shared-expert gate)
and expert-sharded (routed experts: / (ETP x EP)). The most loaded pipeline stage holds 1/PP of
the transformer block, the whole MTP block and the embedding (plus the output layer when
untied on a single stage). Bytes per parameter assume bf16 training with fp32 grads, main
params and Adam states: 18, or 6 + 12/DP with the distributed optimizer (experts: 12/EDP).
"""

from __future__ import annotations


def _moe_layer_pattern(args) -> list[int]:
    if args.num_experts is None:
        return [0] * args.num_layers
    freq = args.moe_layer_freq
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(args.num_layers)]
    if len(freq) != args.num_layers:
        raise ValueError(f"moe_layer_freq has {len(freq)} entries; expected {args.num_layers}")
    return list(freq)


def _attention_params(args, norm_size: int) -> float:
    h, n = args.hidden_size, args.num_attention_heads
    if args.multi_latent_attention:
        qk = args.qk_head_dim + args.qk_pos_emb_head_dim
        if args.q_lora_rank is None:
            q_term = h * n * qk
        else:  # q down-projection, q norm, q up-projection
            q_term = args.q_lora_rank * (h + n * qk + norm_size)
        kv_term = args.kv_lora_rank * (h + n * (args.qk_head_dim + args.v_head_dim) + norm_size)
        return q_term + kv_term + h * args.qk_pos_emb_head_dim + n * args.v_head_dim * h
    groups = args.num_query_groups if args.group_query_attention else n
    q_ratio = args.kv_channels * n / h
    return 2 * h * h * (1 + groups / n) * q_ratio  # QKV + output projection


def _layer_params(args) -> dict[str, float]:
    """Parameters of one layer, by kind."""
    h = args.hidden_size
    glu = 3 / 2 if args.swiglu else 1
    norm_size = 1 if args.normalization == "RMSNorm" else 2  # LayerNorm has a bias
    moe = args.num_experts is not None
    num_experts = args.num_experts if moe else 1
    moe_ffn = args.moe_ffn_hidden_size if moe else 0
    shared_ffn = args.moe_shared_expert_intermediate_size or 0
    latent = args.moe_latent_size
    routed_width = latent if latent is not None else h  # latent MoE: experts run at that width
    return {
        "attention": _attention_params(args, norm_size),
        "dense_mlp": 2 * h * args.ffn_hidden_size * glu,
        "shared_expert": 2 * h * shared_ffn * glu,
        "routed": 2 * routed_width * moe_ffn * num_experts * glu,
        "active_routed": 2 * routed_width * moe_ffn * args.moe_router_topk * glu if moe else 0,
        "latent_proj": 2 * h * latent if moe and latent is not None else 0,
        "norms": 2 * h * norm_size,
        "router": h * num_experts + (num_experts if args.add_bias_linear else 0) if moe else 0,
        "shared_gate": h
        if shared_ffn > 0 and getattr(args, "moe_shared_expert_gate", False)
        else 0,
        "final_norm": norm_size * h,
    }


def _print_counts(args, p, num_dense, num_moe, mtp_dense, mtp_moe) -> None:
    dense = p["attention"] + p["dense_mlp"] + p["norms"]
    moe_common = p["attention"] + p["shared_expert"] + p["latent_proj"] + p["norms"]
    moe_common += p["router"] + p["shared_gate"]
    block = dense * num_dense + (moe_common + p["routed"]) * num_moe + p["final_norm"]
    active = dense * num_dense + (moe_common + p["active_routed"]) * num_moe + p["final_norm"]
    mtp = dense * mtp_dense + (moe_common + p["routed"]) * mtp_moe
    embedding = args.hidden_size * args.padded_vocab_size
    embedding *= 2 if args.untie_embeddings_and_output_weights else 1
    print(f"Number of parameters in transformer block in billions: {block / 1e9: .2f}")
    print(f"Number of active parameters in transformer block in billions: {active / 1e9: .2f}")
    if args.mtp_num_layers is not None:
        print(f"Number of parameters in mtp block in billions: {mtp / 1e9: .2f}")
    print(f"Number of parameters in embedding layers in billions: {embedding / 1e9:.2f}")
    print(f"Total number of parameters in billions: {(block + mtp + embedding) / 1e9:.2f}")
    print(f"Total number of active parameters in billions: {(active + mtp + embedding) / 1e9:.2f}")


def compute_weight_and_optimizer_memory(args, verbose: bool = False) -> float:
    """Bytes of weights, gradients and optimizer state on the most loaded rank."""
    pattern = _moe_layer_pattern(args)
    num_moe = sum(pattern)
    num_dense = args.num_layers - num_moe
    mtp_layers = args.mtp_num_layers or 0
    mtp_moe = pattern[-1] * mtp_layers  # MTP layers repeat the last layer's MLP kind
    mtp_dense = mtp_layers - mtp_moe
    p = _layer_params(args)
    if verbose:
        _print_counts(args, p, num_dense, num_moe, mtp_dense, mtp_moe)

    tp_dense = p["attention"] + p["dense_mlp"]
    tp_moe = p["attention"] + p["shared_expert"]
    rep_moe = p["norms"] + p["latent_proj"] + p["router"] + p["shared_gate"]
    tp_block = tp_dense * num_dense + tp_moe * num_moe
    rep_block = p["norms"] * num_dense + rep_moe * num_moe + p["final_norm"]
    expert_block = p["routed"] * num_moe
    tp_mtp = tp_dense * mtp_dense + tp_moe * mtp_moe
    rep_mtp = p["norms"] * mtp_dense + rep_moe * mtp_moe
    expert_mtp = p["routed"] * mtp_moe

    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    etp, ep = args.expert_tensor_parallel_size, args.expert_model_parallel_size
    embedding = args.hidden_size * args.padded_vocab_size
    tp_params = (tp_block / pp + tp_mtp + embedding) / tp
    if args.untie_embeddings_and_output_weights and pp == 1:
        tp_params += embedding / tp  # the output layer sits on the same (only) stage
    rep_params = rep_block / pp + rep_mtp
    expert_params = (expert_block / pp + expert_mtp) / (etp * ep)
    if verbose:
        total = tp_params + rep_params + expert_params
        print(f"Number of parameters in most loaded shard in billions: {total / 1e9:.4f}")
        if pp > 1:
            other = tp_block / (pp * tp) + rep_block / pp + expert_block / (pp * etp * ep)
            print(f"Number of parameters in other shards in billions: {other / 1e9:.4f}")

    def bytes_per_param(dp_size: int) -> float:
        return 6 + 12 / dp_size if args.use_distributed_optimizer else 18

    expert_dp = args.world_size // (etp * ep * pp)
    return (tp_params + rep_params) * bytes_per_param(args.data_parallel_size) + (
        expert_params * bytes_per_param(expert_dp)
    )

"""Megatron 0.20's FLOP count of one global batch (`megatron.training.training.
num_floating_point_operations`), for the names Megatron's tests and scripts call.

gigatron's own logs use `gigatron.training.flops` (full, not causally halved, attention
scores). Megatron's count halves the score matmuls for the causal mask and splits attention in
two: token-linear work (projections, MLP, MoE, MTP, logits) times the real token count
`sum(L_i)`, and core attention (QK^T, PV) times `sum(L_i^2)`. Defaults are the unpacked
(BSHD) values `batch * s` and `batch * s^2`. Every GEMM counts 3 times (forward, wgrad, dgrad)
at 2 FLOPs per multiply-add.

    T: real tokens, S2: sum(L_i^2), h: hidden, n: heads, d: kv_channels, g: query groups
    attention (per layer)  6*T*(h*(q + 2*g*d + gate) + q*h) + 6*S2*q        q = n*d
    mlp / moe              6*T*h*m*(f*dense + f_moe*k*moe + f_shared*moe)   m = 3 GLU else 2
    logits (+ MTP heads)   6*T*h*V*(mtp + 1)
"""

from __future__ import annotations

_FB, _FMA = 3, 2  # forward + two backward GEMMs; 2 FLOPs per multiply-add
_GDN_VARIANTS = ("gdn", "gdn2", "gated_delta_net")  # the last: Megatron's deprecated spelling
_HYBRID_SYMBOLS = "MG*-E"  # mamba, gated delta net, attention, mlp, moe (what is counted)
_GDP_SPECS = {"gdp_stack_spec", "gated_delta_product_stack_spec"}


def _layer_pattern(freq, num_layers: int, name: str, one_if) -> list[int]:
    """An int frequency or an explicit 0/1 list -> one 0/1 per layer."""
    if isinstance(freq, int):
        return [1 if one_if(i, freq) else 0 for i in range(num_layers)]
    if isinstance(freq, list):
        if len(freq) != num_layers:
            raise ValueError(f"{name} has {len(freq)} entries; expected {num_layers}: {freq}")
        return freq
    raise ValueError(f"{name} must be an int or a list of 0/1, got {freq!r}")


def _moe_ffn(args) -> int:
    """Expert FFN width: --moe-ffn-hidden-size, else --ffn-hidden-size."""
    if args.moe_ffn_hidden_size is not None:
        return args.moe_ffn_hidden_size
    return args.ffn_hidden_size


def _attention_terms(args, num_query_groups: int) -> tuple[float, float]:
    """(token-linear FLOPs per token, core FLOPs per unit of sum(L^2)) of one attention layer."""
    h, n = args.hidden_size, args.num_attention_heads
    if args.multi_latent_attention:
        qk = args.qk_head_dim + args.qk_pos_emb_head_dim
        if args.q_lora_rank is None:
            q_term = h * n * qk
        else:
            q_term = args.q_lora_rank * (h + n * qk + 1)
        kv_term = args.kv_lora_rank * (h + n * (args.qk_head_dim + args.v_head_dim) + 1)
        linear = q_term + kv_term + h * args.qk_pos_emb_head_dim + n * args.v_head_dim * h
        core = n * qk / 2 + n * args.v_head_dim / 2
        return _FB * _FMA * linear, _FB * _FMA * core
    q = args.kv_channels * n
    kv = args.kv_channels * num_query_groups
    gate = q if args.attention_output_gate else 0
    linear = h * (q + 2 * kv + gate) + q * h
    return _FB * _FMA * linear, _FB * _FMA * q / 2 * 2  # causal half, two score matmuls


def _gdn_forward_per_token(args) -> float:
    """Gated delta net layer, forward FLOPs per token (the transformer path's linear attention)."""
    qk_dim = args.linear_key_head_dim * args.linear_num_key_heads
    v_dim = args.linear_value_head_dim * args.linear_num_value_heads
    if args.experimental_attention_variant == "gdn2":
        in_proj = 4 * qk_dim + 3 * v_dim
    else:
        in_proj = 2 * qk_dim + 2 * v_dim + 2 * args.linear_num_value_heads
    return _FMA * (
        args.hidden_size * in_proj
        + args.linear_conv_kernel_dim * (2 * qk_dim + v_dim)
        + args.linear_num_value_heads * args.linear_value_head_dim**2 * 4
        + args.hidden_size * v_dim
    )


def transformer_flops(args, total_tokens, seqlen_squared_sum) -> float:
    """GPT-style model: dense / MoE MLPs, MHA / GQA / MLA / linear attention, MTP."""
    h = args.hidden_size
    groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
    if args.num_experts is None:
        num_dense, num_moe, topk, last_is_moe = args.num_layers, 0, 0, 0
    else:
        moe_pattern = _layer_pattern(
            args.moe_layer_freq, args.num_layers, "moe_layer_freq", lambda i, f: i % f == 0
        )
        num_moe = sum(moe_pattern)
        num_dense, topk, last_is_moe = (
            args.num_layers - num_moe,
            args.moe_router_topk,
            moe_pattern[-1],
        )
    mtp = args.mtp_num_layers or 0
    num_moe += last_is_moe * mtp  # each MTP layer repeats the last layer's MLP kind
    num_dense += (1 - last_is_moe) * mtp
    num_layers = args.num_layers + mtp

    m = 3 if args.swiglu else 2
    moe_ffn = (
        args.moe_ffn_hidden_size if args.moe_ffn_hidden_size is not None else args.ffn_hidden_size
    )
    shared_ffn = args.moe_shared_expert_intermediate_size or 0
    latent = args.moe_latent_size
    if latent is None:
        routed = moe_ffn * topk * m
    else:  # routed experts run at the latent width, plus its up and down projections
        routed = moe_ffn * topk * m * latent / h + 2 * latent
    mlp = (
        _FB
        * _FMA
        * h
        * (args.ffn_hidden_size * m * num_dense + (routed + shared_ffn * m) * num_moe)
    )

    attn_linear, attn_core = _attention_terms(args, groups)
    variant = args.experimental_attention_variant
    if variant is not None and variant in _GDN_VARIANTS:
        la_pattern = _layer_pattern(
            args.linear_attention_freq,
            num_layers,
            "linear_attention_freq",
            lambda i, f: (i + 1) % f != 0,  # every f-th layer keeps softmax attention
        )
        num_linear = sum(la_pattern)
        linear_term = _FB * _gdn_forward_per_token(args)
    else:
        num_linear, linear_term = 0, 0
    num_standard = num_layers - num_linear
    attention = linear_term * num_linear + attn_linear * num_standard

    mtp_extra = _FB * _FMA * mtp * (3 * h + 2 * h * h)  # MTP norms and eh projection
    logits = _FB * _FMA * h * args.padded_vocab_size * (mtp + 1)
    per_token = mlp + attention + mtp_extra + logits
    return total_tokens * per_token + seqlen_squared_sum * attn_core * num_standard


def _uses_gated_delta_product(args) -> bool:
    """True when `args.spec` (a string or list) ends in a GDP stack spec name."""
    spec = getattr(args, "spec", None)
    if spec is None:
        return False
    parts = [spec] if isinstance(spec, str) else list(spec)
    words = []
    for part in parts:
        words += str(part).replace("[", " ").replace("]", " ").replace(",", " ").split()
    return bool(words) and words[-1] in _GDP_SPECS


def _mamba_forward(args, tokens) -> float:
    h, state, groups = args.hidden_size, args.mamba_state_dim, args.mamba_num_groups
    if _uses_gated_delta_product(args):
        return _gdp_forward(args, tokens)
    d_in = 2 * h
    heads = args.mamba_num_heads or d_in // args.mamba_head_dim
    in_proj = 2 * tokens * h * (2 * d_in + 2 * groups * state + heads)
    return in_proj + 7 * tokens * d_in * state + 2 * tokens * d_in * h


def _gdp_forward(args, tokens, conv_kernel_dim: int = 4) -> float:
    """Gated delta product layer (a Mamba slot under a GDP stack spec), forward."""
    h, state, groups = args.hidden_size, args.mamba_state_dim, args.mamba_num_groups
    k = args.gdp_num_householder
    heads = args.mamba_num_heads
    if heads is None:
        d_inner = 2 * h
        heads = d_inner // args.mamba_head_dim
    else:
        d_inner = heads * args.mamba_head_dim
    in_proj = (d_inner + groups * state + heads) * (1 + k)
    conv = d_inner * k + groups * state * (1 + k)
    non_core = 2 * tokens * (h * in_proj + conv_kernel_dim * conv + d_inner * h)
    return non_core + (4 * k + 3) * tokens * d_inner * state


def hybrid_flops(args, total_tokens, seqlen_squared_sum) -> float:
    """Hybrid model from `args.hybrid_layer_pattern` (M mamba, G gated delta net, * attention,
    - mlp, E moe; '|' and '/' separators and other symbols add nothing)."""
    counts = {s: args.hybrid_layer_pattern.count(s) for s in _HYBRID_SYMBOLS}
    h, n, tokens = args.hidden_size, args.num_attention_heads, total_tokens
    glu = 3.0 / 2.0 if args.swiglu else 1.0
    p = args.kv_channels * n / h if args.kv_channels else 1
    g = args.num_query_groups if args.group_query_attention else n
    attn = 4 * tokens * h * p * (h + h * (g / n)) + 2 * seqlen_squared_sum * h * p
    mlp = 4 * (args.ffn_hidden_size / h) * glu * tokens * h**2
    moe_ffn = (
        args.moe_ffn_hidden_size if args.moe_ffn_hidden_size is not None else args.ffn_hidden_size
    )
    shared = args.moe_shared_expert_intermediate_size or 0
    topk, latent = args.moe_router_topk, args.moe_latent_size
    if latent is None:
        moe = 4 * tokens * h * moe_ffn * topk * glu
    else:
        moe = 4 * tokens * latent * moe_ffn * topk * glu + 4 * tokens * h * latent
    moe += 4 * tokens * h * shared * glu
    gdn = _hybrid_gdn_forward(args, tokens)
    mtp = args.mtp_num_layers or 0
    forward = (
        counts["*"] * attn
        + counts["-"] * mlp
        + counts["M"] * _mamba_forward(args, tokens)
        + counts["E"] * moe
        + counts["G"] * gdn
        + 2 * tokens * h * args.padded_vocab_size * (1 + mtp)
    )
    return forward * _FB


def _hybrid_gdn_forward(args, tokens) -> float:
    """Gated delta net layer of a hybrid stack, forward, with Megatron's defaults for unset
    sizes (head dims 128, 16 key / 32 value heads, conv kernel 4)."""
    qk_head = args.linear_key_head_dim or 128
    v_head = args.linear_value_head_dim or 128
    v_heads = args.linear_num_value_heads or 32
    qk_dim = qk_head * (args.linear_num_key_heads or 16)
    v_dim = v_head * v_heads
    if args.experimental_attention_variant == "gdn2":
        in_proj = 4 * qk_dim + 3 * v_dim
    else:
        in_proj = 2 * qk_dim + 2 * v_dim + 2 * v_heads
    conv = args.linear_conv_kernel_dim or 4
    h = args.hidden_size
    per_token = h * in_proj + conv * (2 * qk_dim + v_dim) + v_heads * v_head**2 * 4 + h * v_dim
    return 2 * tokens * per_token


def num_floating_point_operations(
    args, batch_size, seqlen_squared_sum_in_batch=None, total_real_tokens_in_batch=None
) -> float:
    """FLOPs of one global batch of `batch_size` samples (Megatron's count).

    `total_real_tokens_in_batch` (sum L_i) scales the token-linear work and
    `seqlen_squared_sum_in_batch` (sum L_i^2) the core attention; None means unpacked
    sequences of `args.seq_length`.
    """
    if seqlen_squared_sum_in_batch is None:
        seqlen_squared_sum_in_batch = batch_size * args.seq_length * args.seq_length
    if total_real_tokens_in_batch is None:
        total_real_tokens_in_batch = batch_size * args.seq_length
    if getattr(args, "hybrid_layer_pattern", None) is not None:
        return hybrid_flops(args, total_real_tokens_in_batch, seqlen_squared_sum_in_batch)
    return transformer_flops(args, total_real_tokens_in_batch, seqlen_squared_sum_in_batch)

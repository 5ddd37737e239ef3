"""Validation of the MoE fields of TransformerConfig (run when an MoE layer is built).

Each check raises ValueError naming the field, its value and the rule, before any collective.
Megatron features gigatron's MoE lacks (sinkhorn / global aux loss, the flex dispatcher, MoE
layer recompute) are rejected rather than ignored.
"""

from __future__ import annotations

_BALANCING = ("aux_loss", "seq_aux_loss", "none")
_UNSUPPORTED_BALANCING = ("sinkhorn", "global_aux_loss", "quantile_balancing")


def _where(msg: str) -> str:
    return f"{msg} (gigatron/core/transformer/moe)"


def check_moe_config(config, ep_size: int, etp_size: int) -> None:
    e, k = config.num_moe_experts, config.moe_router_topk
    if e is None:
        raise ValueError(_where("num_moe_experts is None: an MoE layer needs num_moe_experts set"))
    if e % ep_size:
        raise ValueError(
            _where(
                f"num_moe_experts ({e}) must be divisible by expert_model_parallel_size ({ep_size})"
            )
        )
    if not 1 <= k <= e:
        raise ValueError(
            _where(f"moe_router_topk ({k}) must be between 1 and num_moe_experts ({e})")
        )
    types = config.moe_router_load_balancing_type
    type_list = [types] if isinstance(types, str) else list(types)
    for t in type_list:
        if t in _UNSUPPORTED_BALANCING:
            raise ValueError(
                _where(
                    f"moe_router_load_balancing_type {t!r} is not supported by gigatron "
                    f"(supported: {', '.join(_BALANCING)})"
                )
            )
        if t not in _BALANCING:
            raise ValueError(
                _where(f"moe_router_load_balancing_type ({t!r}) must be one of {_BALANCING}")
            )
    coeff = config.moe_aux_loss_coeff
    if not isinstance(types, str) and (
        isinstance(coeff, (int, float)) or len(coeff) != len(type_list)
    ):
        raise ValueError(
            _where(
                f"moe_aux_loss_coeff ({coeff}) must be a list as long as "
                f"moe_router_load_balancing_type ({types})"
            )
        )
    if config.moe_router_score_function not in ("softmax", "sigmoid"):
        raise ValueError(
            _where(
                f"moe_router_score_function ({config.moe_router_score_function!r}) must be "
                "'softmax' or 'sigmoid' ('sqrtsoftplus' is not supported by gigatron)"
            )
        )
    if config.moe_router_enable_expert_bias and config.moe_router_score_function != "sigmoid":
        raise ValueError(
            _where(
                "moe_router_enable_expert_bias=True requires moe_router_score_function="
                f"'sigmoid' (got {config.moe_router_score_function!r})"
            )
        )
    if config.moe_router_dtype not in (None, "fp32", "fp64"):
        raise ValueError(
            _where(f"moe_router_dtype ({config.moe_router_dtype!r}) must be None, 'fp32' or 'fp64'")
        )
    _check_groups(config, e, k)
    _check_dispatch(config, etp_size)


def _check_groups(config, e: int, k: int) -> None:
    groups, group_topk = config.moe_router_num_groups, config.moe_router_group_topk
    if (groups is None) != (group_topk is None):
        raise ValueError(
            _where(
                f"moe_router_num_groups ({groups}) and moe_router_group_topk ({group_topk}) "
                "must be set together"
            )
        )
    if groups is not None and (e % groups or not 1 <= group_topk <= groups or k % group_topk):
        raise ValueError(
            _where(
                f"group-limited routing needs num_moe_experts ({e}) divisible by "
                f"moe_router_num_groups ({groups}), 1 <= moe_router_group_topk ({group_topk}) "
                f"<= num_groups, and moe_router_topk ({k}) divisible by group_topk"
            )
        )


def _check_dispatch(config, etp_size: int) -> None:
    kind = config.moe_token_dispatcher_type
    if kind not in ("allgather", "alltoall"):
        raise ValueError(
            _where(
                f"moe_token_dispatcher_type ({kind!r}) must be 'allgather' or 'alltoall' "
                "('flex' needs DeepEP/HybridEP kernels gigatron does not have)"
            )
        )
    if (
        config.moe_shared_expert_overlap
        and config.moe_shared_expert_intermediate_size is not None
        and kind != "alltoall"
    ):
        raise ValueError(
            _where(
                f"moe_shared_expert_overlap=True requires moe_token_dispatcher_type='alltoall' "
                f"(got {kind!r}; as Megatron, which also allows 'flex')"
            )
        )
    if config.moe_shared_expert_gate and config.moe_shared_expert_intermediate_size is None:
        raise ValueError(
            _where(
                "moe_shared_expert_gate=True needs moe_shared_expert_intermediate_size (the gate "
                "scales the shared experts' output; Megatron ignores it without them)"
            )
        )
    cap = config.moe_expert_capacity_factor
    if cap is not None and cap <= 0:
        raise ValueError(_where(f"moe_expert_capacity_factor ({cap}) must be positive or None"))
    if config.moe_pad_expert_input_to_capacity and cap is None:
        raise ValueError(
            _where("moe_pad_expert_input_to_capacity=True requires moe_expert_capacity_factor")
        )
    if config.moe_token_drop_policy not in ("probs", "position"):
        raise ValueError(
            _where(
                f"moe_token_drop_policy ({config.moe_token_drop_policy!r}) must be 'probs' "
                "or 'position'"
            )
        )
    if config.add_bias_linear and etp_size > 1:
        # Megatron accepts it, but each expert-TP rank adds the whole linear_fc2 bias to its
        # partial output before the sum over those ranks: the bias counts etp_size times.
        raise ValueError(
            _where(
                f"add_bias_linear=True in MoE with expert_tensor_parallel_size {etp_size}: "
                f"gigatron refuses it (Megatron adds the full linear_fc2 bias on each of the "
                f"{etp_size} expert-TP ranks before their sum); use expert_tensor_parallel_size "
                "1 or add_bias_linear=False"
            )
        )
    f = config.moe_ffn_hidden_size
    if f is not None and f % etp_size:
        raise ValueError(
            _where(
                f"moe_ffn_hidden_size ({f}) must be divisible by expert_tensor_parallel_size "
                f"({etp_size})"
            )
        )
    if config.moe_layer_recompute:
        raise ValueError(_where("moe_layer_recompute=True is not supported by gigatron"))

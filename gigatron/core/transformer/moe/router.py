"""Top-k token router with load-balancing losses, z-loss, expert bias and capacity dropping.

Mirrors `megatron.core.transformer.moe.router` (Router, TopKRouter). The gate weight
`[E, h]` is fp32 at creation, cast to params_dtype, replicated over TP and marked
`sequence_parallel` (under SP each TP rank routes its own s/tp tokens, so its grad is summed over
TP by finalize_model_grads). Aux losses do not enter the returned loss: they are attached to
`probs` / `logits` with MoEAuxLossAutoScaler and logged per layer through the tracker.

Shapes: s: seq (s/tp under SP), b: micro-batch, h: hidden, T = s*b tokens, E: experts, k: top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.moe import moe_utils
from gigatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from gigatron.core.utils import group_size, parameter_device

_ROUTER_DTYPES = {None: None, "fp32": torch.float32, "fp64": torch.float64}


def _param_device(config) -> torch.device:
    """Where the other layers put their parameters: CPU under CPU init, else the accelerator."""
    return parameter_device(config)


class Router(MegatronModule):
    """Gate `logits = x W^T (+ b)`; subclasses turn logits into (probs, routing_map)."""

    def __init__(self, config, pg_collection=None) -> None:
        super().__init__(config)
        if pg_collection is None:
            pg_collection = moe_utils.get_default_pg_collection()
        self.num_experts = config.num_moe_experts
        self.layer_number = None
        self.tp_group, self.cp_group = pg_collection.tp, pg_collection.cp
        self.tp_cp_group = pg_collection.tp_cp
        self.tp_dp_cp_group = pg_collection.tp_dp_cp
        device = _param_device(config)
        # layer_number as a tensor (0: unset) for the aux-loss tracker: an int attribute read
        # in a compiled layer is a constant of its graph (one graph per layer), a tensor is not
        number = torch.zeros((), dtype=torch.int64, device=device)
        self.register_buffer("layer_number_tensor", number, persistent=False)
        e, h = config.num_moe_experts, config.hidden_size
        self.weight = torch.nn.Parameter(torch.empty(e, h, dtype=torch.float32, device=device))
        if config.add_bias_linear:
            self.bias = torch.nn.Parameter(torch.empty(e, dtype=torch.float32, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.config.perform_initialization:
            self.config.init_method(self.weight)
            if self.bias is not None:
                with torch.no_grad():
                    self.bias.zero_()
        for p in (self.weight, self.bias):
            if p is not None:
                p.data = p.data.to(self.config.params_dtype)
                p.sequence_parallel = self.config.sequence_parallel

    def gating(self, input: Tensor) -> Tensor:
        """[s, b, h] -> logits [s, b, E] in `moe_router_dtype` (default: the input dtype)."""
        dtype = _ROUTER_DTYPES[self.config.moe_router_dtype] or input.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(input.to(dtype), self.weight.to(dtype), bias)

    def set_layer_number(self, layer_number: int) -> None:
        """Global 1-based layer number, used to file aux losses per layer."""
        self.layer_number = layer_number
        with torch.no_grad():
            self.layer_number_tensor.fill_(layer_number or 0)


class TopKRouter(Router):
    """Route each token to its top-k experts (see module docstring)."""

    def __init__(self, config, pg_collection=None, is_mtp_layer: bool = False) -> None:
        super().__init__(config, pg_collection)
        self.is_mtp_layer = is_mtp_layer  # Megatron 0.19+ (multi-token prediction: not built)
        self.topk = config.moe_router_topk
        self.routing_type = config.moe_router_load_balancing_type
        self.score_function = config.moe_router_score_function
        self.enable_expert_bias = config.moe_router_enable_expert_bias
        if self.enable_expert_bias:
            e = config.num_moe_experts
            device = _param_device(config)
            self.register_buffer(
                "local_tokens_per_expert", torch.zeros(e, device=device), persistent=False
            )
            self.register_buffer("expert_bias", torch.zeros(e, device=device))
        else:
            self.local_tokens_per_expert = None
            self.expert_bias = None

    # ---- loss coefficients
    def get_aux_loss_coeff(self, aux_loss_type: str) -> float:
        """Coefficient of `aux_loss_type` ('aux_loss', 'seq_aux_loss'); 0 when not enabled."""
        types, coeffs = self.routing_type, self.config.moe_aux_loss_coeff
        if isinstance(types, str):
            return coeffs if types == aux_loss_type else 0.0
        if aux_loss_type in types:
            return coeffs[types.index(aux_loss_type)]
        return 0.0

    def is_aux_loss_enabled(self) -> bool:
        return any(self.get_aux_loss_coeff(t) > 0 for t in ("aux_loss", "seq_aux_loss"))

    def _num_layers(self) -> int:
        return self.config.num_layers + (self.config.mtp_num_layers or 0)

    # ---- losses
    def attach_and_log_load_balancing_loss(
        self,
        activation: Tensor,
        aux_loss_coeff: float,
        aux_loss: Tensor,
        aux_loss_name: str,
        reduce_group,
        valid_token_count=None,
    ) -> Tensor:
        """Log `aux_loss / coeff` for this layer and attach `aux_loss` to `activation`."""
        moe_utils.save_to_aux_losses_tracker(
            aux_loss_name,
            aux_loss / aux_loss_coeff,
            self.layer_number_tensor,
            self._num_layers(),
            reduce_group=reduce_group,
        )
        if self.config.calculate_per_token_loss:
            n = activation.shape[0] if valid_token_count is None else valid_token_count
            aux_loss = aux_loss * n
        return MoEAuxLossAutoScaler.apply(activation, aux_loss)

    def _tokens_per_expert(self, routing_map: Tensor, topk: int, with_padding: bool):
        """(counts [E] summed over TP x CP, local token count, total token count)."""
        from gigatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

        local = routing_map.sum(dim=0).float()
        counts = reduce_from_tensor_model_parallel_region(local, self.tp_cp_group)
        if with_padding:
            return counts, local.sum() / topk, counts.sum() / topk
        n = routing_map.shape[0]
        return counts, n, n * group_size(self.tp_cp_group)

    def _apply_aux_loss(self, probs, scores, routing_map, with_padding: bool) -> Tensor:
        coeff = self.get_aux_loss_coeff("aux_loss")
        if coeff == 0:
            return probs
        counts, n_local, n_total = self._tokens_per_expert(routing_map, self.topk, with_padding)
        aux = moe_utils.switch_load_balancing_loss_func(
            scores, counts, n_total, self.topk, self.num_experts, coeff
        )
        return self.attach_and_log_load_balancing_loss(
            probs, coeff, aux, "load_balancing_loss", self.tp_cp_group, n_local
        )

    def _apply_seq_aux_loss(self, probs, scores, routing_map, s: int, b: int, with_padding):
        """Per-sequence aux loss (DeepSeek): the b sequences act as b groups of E columns."""
        coeff = self.get_aux_loss_coeff("seq_aux_loss")
        if coeff == 0:
            return probs
        scores, routing_map = scores.reshape(s, -1), routing_map.reshape(s, -1)  # [s, b*E]
        counts, n_local, n_total = self._tokens_per_expert(routing_map, self.topk * b, with_padding)
        aux = (
            moe_utils.switch_load_balancing_loss_func(
                scores, counts, n_total, self.topk, self.num_experts, coeff
            )
            / b
        )
        return self.attach_and_log_load_balancing_loss(
            probs, coeff, aux, "seq_load_balancing_loss", self.tp_cp_group, n_local
        )

    def apply_z_loss(self, logits: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Attach `z_coeff / (tp*cp) * mean(logsumexp(logits)^2)` to the logits [T, E]."""
        if self.config.moe_z_loss_coeff is None or not (self.training and torch.is_grad_enabled()):
            return logits
        coeff = self.config.moe_z_loss_coeff / group_size(self.tp_cp_group)
        z_loss = moe_utils.z_loss_func(logits, coeff, padding_mask=padding_mask)
        scaled = z_loss
        if self.config.calculate_per_token_loss:
            n = logits.shape[0] if padding_mask is None else (~padding_mask).sum()
            scaled = z_loss * n
        logits = MoEAuxLossAutoScaler.apply(logits, scaled)
        moe_utils.save_to_aux_losses_tracker(
            "z_loss", z_loss / coeff, self.layer_number_tensor, self._num_layers()
        )
        return logits

    def apply_input_jitter(self, input: Tensor) -> Tensor:
        """Multiply by U(1 - eps, 1 + eps) noise (Switch Transformer) when moe_input_jitter_eps."""
        eps = self.config.moe_input_jitter_eps
        if eps is None or not self.training:
            return input
        noise = torch.empty_like(input).uniform_(1.0 - eps, 1.0 + eps)
        return input * noise

    # ---- routing
    def routing(self, logits: Tensor, padding_mask: Tensor | None = None):
        """logits [s, b, E] -> (probs [T, E], routing_map [T, E] bool).

        padding_mask [s, b]: True = padding token (excluded from losses and bias counts).
        """
        s, b = logits.shape[:2]
        logits = logits.reshape(-1, self.num_experts)  # [T, E]
        if padding_mask is not None:
            padding_mask = padding_mask.reshape(-1)
        logits = self.apply_z_loss(logits, padding_mask)
        cfg = self.config
        probs, routing_map = moe_utils.topk_routing_with_score_function(
            logits,
            self.topk,
            use_pre_softmax=cfg.moe_router_pre_softmax,
            num_groups=cfg.moe_router_num_groups,
            group_topk=cfg.moe_router_group_topk,
            scaling_factor=cfg.moe_router_topk_scaling_factor,
            score_function=self.score_function,
            expert_bias=self.expert_bias,
        )
        if cfg.moe_expert_capacity_factor is not None:
            probs, routing_map = moe_utils.apply_router_token_dropping(
                probs,
                routing_map,
                router_topk=self.topk,
                capacity_factor=cfg.moe_expert_capacity_factor,
                drop_policy=cfg.moe_token_drop_policy,
                pad_to_capacity=cfg.moe_pad_expert_input_to_capacity,
            )
        if self.training and torch.is_grad_enabled() and self.is_aux_loss_enabled():
            aux_map, scores = moe_utils.compute_routing_scores_for_aux_loss(
                logits, self.topk, self.score_function, padding_mask
            )
            padded = padding_mask is not None
            probs = self._apply_aux_loss(probs, scores, aux_map, padded)
            probs = self._apply_seq_aux_loss(probs, scores, aux_map, s, b, padded)
        if self.enable_expert_bias and torch.is_grad_enabled():
            with torch.no_grad():
                counted = (
                    routing_map
                    if padding_mask is None
                    else (routing_map & ~padding_mask.unsqueeze(-1))
                )
                self.local_tokens_per_expert += counted.sum(dim=0)
        return probs, routing_map

    def forward(self, input: Tensor, padding_mask: Tensor | None = None):
        """input [s, b, h] -> (probs [T, E], routing_map [T, E])."""
        # Float16Module casts floating buffers to fp16/bf16: keep the bias and counts exact.
        for buf in (self.expert_bias, self.local_tokens_per_expert):
            if buf is not None and buf.dtype != torch.float32:
                buf.data = buf.data.float()
        input = self.apply_input_jitter(input)
        logits = self.gating(input)
        if self.config.moe_router_force_load_balancing:  # benchmarks: balanced random routing
            logits = moe_utils.apply_random_logits(logits)
        return self.routing(logits, padding_mask=padding_mask)

"""Mixture-of-Experts layer: route -> dispatch -> experts -> combine (+ shared experts).

Mirrors `megatron.core.transformer.moe.moe_layer` (MoESubmodules, BaseMoELayer, MoELayer). It
sits in a TransformerLayer's `mlp` slot and returns `(output, None)` like an MLP. Each EP rank
owns `num_moe_experts / ep` consecutive experts (`local_expert_indices`). Aux losses are not in
the output: the router attaches them to the probs (see `moe_utils.MoEAuxLossAutoScaler`).

With `moe_shared_expert_overlap=True` and EP > 1 the shared experts run inside the alltoall
dispatcher, overlapping its all-to-alls (see `token_dispatcher`); with EP = 1 the flag changes
nothing (Megatron still moves them after the router there; the sums are the same).

Shapes: s: seq (s/tp under sequence parallel), b: micro-batch, h: hidden.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from gigatron.compat import missing_names
from gigatron.core import tensor_parallel
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.moe import moe_utils
from gigatron.core.transformer.moe._checks import check_moe_config
from gigatron.core.transformer.moe.router import TopKRouter
from gigatron.core.transformer.moe.token_dispatcher import (
    MoEAllGatherTokenDispatcher,
    MoEAlltoAllTokenDispatcher,
)
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.utils import group_rank, group_size

_DISPATCHERS = {"allgather": MoEAllGatherTokenDispatcher, "alltoall": MoEAlltoAllTokenDispatcher}


@dataclass
class MoESubmodules:
    """Specs of the experts (SequentialMLP / GroupedMLP), shared experts and router."""

    experts: ModuleSpec | type = None
    shared_experts: ModuleSpec | type = None
    router: type = TopKRouter


class BaseMoELayer(MegatronModule):
    """Groups, local expert indices and the layer number; subclasses define forward."""

    def __init__(self, config, layer_number: int | None = None, pg_collection=None):
        super().__init__(config)
        if pg_collection is None:
            pg_collection = moe_utils.get_default_pg_collection()
        self.pg_collection = pg_collection
        self.ep_group, self.attn_tp_group = pg_collection.ep, pg_collection.tp
        ep_size, ep_rank = group_size(self.ep_group), group_rank(self.ep_group)
        check_moe_config(config, ep_size, group_size(pg_collection.expt_tp))
        self.num_local_experts = config.num_moe_experts // ep_size
        offset = ep_rank * self.num_local_experts
        self.local_expert_indices = [offset + i for i in range(self.num_local_experts)]
        self.use_shared_expert = config.moe_shared_expert_intermediate_size is not None
        self.shared_expert_overlap = config.moe_shared_expert_overlap
        self.router = None
        self.experts = None
        self.shared_experts = None
        self.token_dispatcher = None
        self.layer_number = layer_number

    def set_layer_number(self, layer_number: int) -> None:
        """Global 1-based layer number (the TransformerLayer calls this after building)."""
        self.layer_number = layer_number
        self.router.set_layer_number(layer_number)


class MoELayer(BaseMoELayer):
    """Router + token dispatcher + experts (+ shared experts)."""

    def __init__(
        self,
        config,
        submodules: MoESubmodules | None = None,
        layer_number: int | None = None,
        pg_collection=None,
        is_mtp_layer: bool = False,
        name=None,
    ):
        super().__init__(config, layer_number, pg_collection)
        pg = self.pg_collection
        self.submodules = submodules
        self.router = submodules.router(config=config, pg_collection=pg)
        self.router.set_layer_number(layer_number)
        self._prepare_loss_tracker()
        dispatcher_cls = _DISPATCHERS[config.moe_token_dispatcher_type]
        self.token_dispatcher = dispatcher_cls(
            self.num_local_experts, self.local_expert_indices, config=config, pg_collection=pg
        )
        self.experts = build_module(
            submodules.experts, self.num_local_experts, config, pg_collection=pg
        )
        if self.use_shared_expert:
            self.shared_experts = build_module(
                _without_gate_param(submodules.shared_experts, config),
                config=config,
                pg_collection=pg,
                gate=config.moe_shared_expert_gate,
            )
            if self.shared_expert_overlap and group_size(self.ep_group) > 1:
                # the alltoall dispatcher runs them while its all-to-alls are in flight; with one
                # EP rank there is no all-to-all to hide, and they run before the router as usual
                self.token_dispatcher.set_shared_experts(self.shared_experts)

    def _prepare_loss_tracker(self) -> None:
        """The tracker entries this layer's router writes, created now on the router's device
        (`moe_utils.prepare_aux_losses_tracker`: no recompile of compiled layers at step 2)."""
        router = self.router
        names = [
            name
            for name, kind in (
                ("load_balancing_loss", "aux_loss"),
                ("seq_load_balancing_loss", "seq_aux_loss"),
            )
            if router.get_aux_loss_coeff(kind) > 0
        ]
        if self.config.moe_z_loss_coeff is not None:
            names.append("z_loss")
        num_layers = self.config.num_layers + (self.config.mtp_num_layers or 0)
        moe_utils.prepare_aux_losses_tracker(names, num_layers, router.weight.device)

    @property
    def sync_free(self) -> bool:
        """Whether forward and backward run without a host sync, so torch.compile traces the
        layer as one graph: one rank holds every expert and nothing is dropped (the dispatcher's
        `dropless_local`) and the experts need no counts on the host (GroupedMLP). Otherwise the
        collectives' split sizes (EP / expert TP > 1), capacity dropping or SequentialMLP's
        per-expert slices read the token counts on the host."""
        return self.token_dispatcher.dropless_local and getattr(self.experts, "sync_free", False)

    def _recompute_shared_experts(self) -> bool:
        """Selective recompute "shared_experts": checkpoint them while training."""
        c = self.config
        return (
            c.recompute_granularity == "selective"
            and "shared_experts" in c.recompute_modules
            and self.training
            and torch.is_grad_enabled()
        )

    def route(self, hidden_states: Tensor, padding_mask: Tensor | None = None):
        """[s, b, h] -> (probs [T, E], routing_map [T, E])."""
        return self.router(hidden_states, padding_mask)

    def forward(
        self, hidden_states: Tensor, intermediate_tensors=None, padding_mask: Tensor | None = None
    ):
        """[s, b, h] -> ([s, b, h], None). padding_mask [b, s], True = padding."""
        if (
            self.training
            and group_size(self.attn_tp_group) > 1
            and not (self.config.sequence_parallel)
        ):
            raise ValueError(
                "MoELayer: training with tensor_model_parallel_size "
                f"({group_size(self.attn_tp_group)}) > 1 requires sequence_parallel=True "
                "(as Megatron)"
            )
        if intermediate_tensors is not None:
            raise ValueError("MoELayer: intermediate_tensors (CUDA-graph partial runs) unsupported")
        if padding_mask is not None:
            padding_mask = padding_mask.transpose(0, 1).bool()  # [s, b]
        shared_out = None
        if self.use_shared_expert and self.token_dispatcher.shared_experts is None:
            # else inside dispatch / combine (moe_shared_expert_overlap, which excludes recompute)
            if self._recompute_shared_experts():
                shared_out = tensor_parallel.checkpoint(self.shared_experts, False, hidden_states)
            else:
                shared_out = self.shared_experts(hidden_states)
        probs, routing_map = self.route(hidden_states, padding_mask)
        dispatcher = self.token_dispatcher
        x, probs = dispatcher.dispatch_preprocess(hidden_states, routing_map, probs)
        x, probs = dispatcher.token_dispatch(x, probs)
        x, tokens_per_expert, permuted_probs = dispatcher.dispatch_postprocess(x, probs)
        expert_out, mlp_bias = self.experts(x, tokens_per_expert, permuted_probs)
        out = dispatcher.combine_preprocess(expert_out)
        out = dispatcher.token_combine(out)
        out = dispatcher.combine_postprocess(out)
        if shared_out is not None:
            out = out + shared_out
        return out, mlp_bias


def _without_gate_param(spec, config):
    """The shared experts' spec without a `gate` in its params: the config's
    moe_shared_expert_gate decides (as in Megatron's MoELayer); older specs spell
    `params={"gate": False}`, which must agree with it."""
    params = getattr(spec, "params", None) or {}
    if "gate" not in params:
        return spec
    if bool(params["gate"]) != config.moe_shared_expert_gate:
        raise ValueError(
            f"the shared experts' spec has params gate={params['gate']} but "
            f"moe_shared_expert_gate={config.moe_shared_expert_gate}: they must agree "
            "(the config field decides)"
        )
    rest = {k: v for k, v in params.items() if k != "gate"}
    return dataclasses.replace(spec, params=rest)


# tutorials' names (MoEMLP, Router, ...) say what to use (gigatron.compat.missing_names)
__getattr__ = missing_names.module_getattr(__name__)

"""Shared experts: a dense MLP every token goes through, added to the routed experts' output.

Mirrors `megatron.core.transformer.moe.shared_experts.SharedExpertMLP` (DeepSeek / Qwen-MoE
style): an ordinary (TP-sharded, not expert) MLP of size `moe_shared_expert_intermediate_size`
whose fc2 bias is added in place. With `gate=True` (`moe_shared_expert_gate`, Qwen2-MoE) its
output is scaled per token by `sigmoid(x @ gate_weight^T)`, `gate_weight` [1, h] replicated on
every TP rank (as Megatron: not TP-sharded; marked `sequence_parallel` under SP, where each
rank sees its own tokens and finalize_model_grads sums its grad over TP).

`moe_shared_expert_overlap=True` (alltoall dispatcher, expert-parallel size > 1): the dispatcher
runs the MLP in Megatron's steps, `pre_forward_comm` (keep the input) ->
`linear_fc1_forward_and_act` while the dispatch all-to-all is in flight -> `linear_fc2_forward`
and `post_forward_comm` while the combine all-to-all is in flight -> `get_output`, added to the
routed output. Megatron runs them on a side CUDA stream and moves the TP collectives out of the
linear layers; gigatron issues the all-to-alls asynchronously (`all_to_all_async`) and runs the
steps, TP collectives included, on the current stream. Same numbers as `forward`.

Shapes: s: seq (s/tp under SP), b: micro-batch, h: hidden, f: shared ffn.
"""

from __future__ import annotations

import copy
import enum

import torch
import torch.nn.functional as F
from torch import Tensor

from gigatron.core.transformer.mlp import MLP, MLPSubmodules
from gigatron.core.utils import make_sharded_tensor_for_checkpoint, parameter_device


class SharedExpertState(enum.Enum):
    """Where the overlapped forward is (Megatron's state machine)."""

    IDLE = 0
    PRE_FORWARD_COMM_DONE = 1
    FC1_FORWARD_DONE = 2
    FC2_FORWARD_DONE = 3
    POST_FORWARD_COMM_DONE = 4


class SharedExpertMLP(MLP):
    """MLP with ffn_hidden_size = moe_shared_expert_intermediate_size; returns the output only."""

    def __init__(
        self,
        config,
        submodules: MLPSubmodules,
        gate: bool = False,
        pg_collection=None,
        name=None,  # Megatron 0.19+: a label
    ):
        cfg = copy.copy(config)
        cfg.ffn_hidden_size = config.moe_shared_expert_intermediate_size
        tp_group = None if pg_collection is None else pg_collection.tp
        super().__init__(cfg, submodules, tp_group=tp_group)
        self.name = name
        self.use_shared_expert_gate = bool(gate)
        if self.use_shared_expert_gate:
            h = config.hidden_size
            weight = torch.empty(1, h, dtype=torch.float32, device=parameter_device(config))
            self.gate_weight = torch.nn.Parameter(weight)  # [1, h]
            if config.perform_initialization:
                config.init_method(self.gate_weight)
            self.gate_weight.data = self.gate_weight.data.to(config.params_dtype)
            self.gate_weight.sequence_parallel = config.sequence_parallel
        else:
            self.gate_weight = None
        self.gate_score = None
        self._reset_overlap()

    def _gate_score(self, hidden_states: Tensor) -> Tensor:
        """[s(/tp), b, h] -> sigmoid(x @ gate_weight^T) [s(/tp), b, 1]."""
        return torch.sigmoid(F.linear(hidden_states, self.gate_weight))

    def _reset_overlap(self) -> None:
        self._overlap_state = SharedExpertState.IDLE
        self.cached_fc1_input = self.cached_fc2_input = None
        self.cached_fc2_output = self.cached_output = None
        self.gate_score = None

    def forward(self, hidden_states: Tensor) -> Tensor:
        """[s, b, h] -> [s, b, h] (bias added, times the gate score with the gate)."""
        output, bias = super().forward(hidden_states)
        output = output if bias is None else output + bias
        if self.use_shared_expert_gate:
            output = output * self._gate_score(hidden_states)
        return output

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """fc1 / fc2's entries, plus `gate_weight` [1, h] (TP-replicated) with the gate."""
        out = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        if self.use_shared_expert_gate:
            key = f"{prefix}gate_weight"
            out[key] = make_sharded_tensor_for_checkpoint(
                self.gate_weight, key, prepend_offsets=sharded_offsets,
                tp_group=getattr(self.linear_fc1, "tp_group", None),
                dp_cp_group=(metadata or {}).get("dp_cp_group"),
            )  # fmt: skip
        return out

    # --- the overlapped forward, in Megatron's steps (called by the alltoall dispatcher) ------

    def _step(self, required: SharedExpertState, following: SharedExpertState, step: str):
        if self._overlap_state != required:
            raise RuntimeError(
                f"SharedExpertMLP.{step} must follow state {required.name}, not "
                f"{self._overlap_state.name} (gigatron/core/transformer/moe/shared_experts.py)"
            )
        self._overlap_state = following

    def wait_current_stream(self) -> None:
        """Megatron syncs its side stream here; gigatron has none (a no-op)."""

    def pre_forward_comm(self, input: Tensor, wait_current_stream: bool = True) -> None:
        """Keep the input [s, b, h] (Megatron's SP all-gather happens in gigatron's fc1). A
        forward that raised midway (out of memory, a failed collective) left its state and
        cached tensors behind: they are dropped here, so the next forward starts clean."""
        if self._overlap_state != SharedExpertState.IDLE:
            self._reset_overlap()
        self._step(
            SharedExpertState.IDLE, SharedExpertState.PRE_FORWARD_COMM_DONE, "pre_forward_comm"
        )
        if self.use_shared_expert_gate:
            self.gate_score = self._gate_score(input)
        self.cached_fc1_input = input

    def linear_fc1_forward_and_act(self, overlapped_comm_output=None) -> None:
        """fc1 (its SP all-gather included) and the activation -> [s, b, f/tp]."""
        self._step(
            SharedExpertState.PRE_FORWARD_COMM_DONE,
            SharedExpertState.FC1_FORWARD_DONE,
            "linear_fc1_forward_and_act",
        )
        self.cached_fc2_input = self._fc1_and_activation(self.cached_fc1_input)
        self.cached_fc1_input = None

    def linear_fc2_forward(self, overlapped_comm_output=None) -> None:
        """fc2 (its SP reduce-scatter / TP all-reduce included) -> [s, b, h] and its bias."""
        self._step(
            SharedExpertState.FC1_FORWARD_DONE,
            SharedExpertState.FC2_FORWARD_DONE,
            "linear_fc2_forward",
        )
        self.cached_fc2_output = self.linear_fc2(self.cached_fc2_input)
        self.cached_fc2_input = None

    def post_forward_comm(self) -> None:
        """Add the fc2 bias (the TP collective already ran inside fc2)."""
        self._step(
            SharedExpertState.FC2_FORWARD_DONE,
            SharedExpertState.POST_FORWARD_COMM_DONE,
            "post_forward_comm",
        )
        output, bias = self.cached_fc2_output
        self.cached_output = output if bias is None else output + bias
        self.cached_fc2_output = None

    def get_output(self) -> Tensor:
        """The shared experts' output [s, b, h]; back to IDLE."""
        self._step(SharedExpertState.POST_FORWARD_COMM_DONE, SharedExpertState.IDLE, "get_output")
        output, self.cached_output = self.cached_output, None
        if self.use_shared_expert_gate:
            output, self.gate_score = output * self.gate_score, None
        return output

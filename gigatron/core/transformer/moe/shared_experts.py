"""Shared experts: a dense MLP every token goes through, added to the routed experts' output.

Mirrors `megatron.core.transformer.moe.shared_experts.SharedExpertMLP` (DeepSeek / Qwen-MoE
style) without the gate: an ordinary (TP-sharded, not expert) MLP of size
`moe_shared_expert_intermediate_size` whose fc2 bias is added in place.

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

from torch import Tensor

from gigatron.core.transformer.mlp import MLP, MLPSubmodules


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
        if gate:
            raise ValueError("SharedExpertMLP: gate=True (gated shared experts) is not supported")
        cfg = copy.copy(config)
        cfg.ffn_hidden_size = config.moe_shared_expert_intermediate_size
        tp_group = None if pg_collection is None else pg_collection.tp
        super().__init__(cfg, submodules, tp_group=tp_group)
        self.name = name
        self.use_shared_expert_gate = False
        self._reset_overlap()

    def _reset_overlap(self) -> None:
        self._overlap_state = SharedExpertState.IDLE
        self.cached_fc1_input = self.cached_fc2_input = None
        self.cached_fc2_output = self.cached_output = None

    def forward(self, hidden_states: Tensor) -> Tensor:
        """[s, b, h] -> [s, b, h] (bias added)."""
        output, bias = super().forward(hidden_states)
        return output if bias is None else output + bias

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
        return output

"""FP8 delayed scaling: Transformer Engine's `DelayedScaling` recipe on gigatron's FP8 linears.

Megatron's default `--fp8-recipe delayed` (`TEDelayedScaling`, fields `fp8_amax_history_len`,
`fp8_amax_compute_algo`, `fp8_margin`). Each FP8 linear keeps a `Fp8DelayedState`: an amax
history `[amax_history_len, 3]` and scales `[3]` for its three cast tensors (ROLE_INPUT,
ROLE_WEIGHT: forward; ROLE_GRAD: the output gradient, backward). A cast multiplies by the
tensor's *stored* scale (made from earlier amaxes, not from the tensor itself) and records the
tensor's amax into history row 0 (max with what the row holds). The update, after each training
forward of a transformer block (forward roles) and after its backward (gradient role), is TE's
`amax_and_scale_update` written in fp32 torch:

1. row 0 of every linear of the block all-reduced (MAX, one packed collective) over the amax
   reduction group (Megatron's `get_amax_reduction_group(with_context_parallel=True)`:
   TP x DP x CP; TP x CP under `tp_only_amax_red`);
2. amax = the max over the whole history (`max`) or row 0 (`most_recent`);
3. the history rolls up one row (row i <- row i+1, the last row <- row 0), row 0 is zeroed;
4. scale = fp8_max / 2**margin / amax where amax is finite and > 0, else the old scale; an
   infinite scale becomes float32's max. Scales start at 1.

Activation recompute: a forward run under a checkpoint stashes the scales it used; the
recompute pops them and records no amax (TE restores its FP8 meta the same way). Eval forwards
(no grad) cast with the current scales and record nothing.
"""

from __future__ import annotations

import contextlib
import io
from collections import deque

import torch
import torch.distributed as dist

ROLE_INPUT, ROLE_WEIGHT, ROLE_GRAD = 0, 1, 2
_FORWARD_ROLES, _BACKWARD_ROLES = slice(0, 2), slice(2, 3)

# "first" while a checkpointed region runs its graph-less forward, "recompute" while backward
# re-runs it; None otherwise (set by tensor_parallel._checkpointing).
_PHASE: list[str | None] = [None]


@contextlib.contextmanager
def recompute_phase(phase: str):
    """Mark the forward of a checkpointed region ("first") or its re-run ("recompute")."""
    previous = _PHASE[0]
    _PHASE[0] = phase
    try:
        yield
    finally:
        _PHASE[0] = previous


class Fp8DelayedState:
    """One FP8 linear's amax history `[history_len, 3]` and scales `[3]` (fp32)."""

    def __init__(self, history_len: int, device=None):
        self.amax_history = torch.zeros(history_len, 3, dtype=torch.float32, device=device)
        self.scale = torch.ones(3, dtype=torch.float32, device=device)
        self._stash: deque[torch.Tensor] = deque()  # scales of forwards awaiting recompute

    def forward_scales(self) -> tuple[torch.Tensor, bool]:
        """(scales `[3]` for this forward's casts, whether to record amaxes)."""
        phase = _PHASE[0]
        if phase == "recompute" and self._stash:
            return self._stash.popleft(), False
        if phase == "first":
            self._stash.append(self.scale.clone())
            return self._stash[-1], True
        return self.scale, torch.is_grad_enabled()

    def record(self, role: int, amax: torch.Tensor) -> None:
        """Fold `amax []` (of the tensor just cast) into row 0 of `role`'s history."""
        row = self.amax_history[0, role]
        row.copy_(torch.maximum(row, amax.to(row.dtype)))

    def state_dict(self) -> dict:
        # TE's key names for its delayed-scaling meta, so checkpoint code sees persistent state
        return {
            "amax_history_fwd": self.amax_history[:, _FORWARD_ROLES].clone(),
            "scale_fwd": self.scale[_FORWARD_ROLES].clone(),
            "amax_history_bwd": self.amax_history[:, _BACKWARD_ROLES].clone(),
            "scale_bwd": self.scale[_BACKWARD_ROLES].clone(),
        }

    def load_state_dict(self, state: dict) -> None:
        history = torch.cat([state["amax_history_fwd"], state["amax_history_bwd"]], dim=1)
        if history.shape != self.amax_history.shape:
            raise ValueError(
                f"FP8 amax history of shape {tuple(history.shape)} in the checkpoint, "
                f"this run keeps {tuple(self.amax_history.shape)} "
                "(fp8_amax_history_len must match the run that saved it)"
            )
        self.amax_history.copy_(history)
        self.scale.copy_(torch.cat([state["scale_fwd"], state["scale_bwd"]]))


def attach_delayed_states(module: torch.nn.Module, recipe) -> list[Fp8DelayedState]:
    """Give each FP8 linear under `module` (those `fp8_utils.set_fp8` gave `recipe`) its state:
    `fp8_state`, or a GroupedMLP one per expert GEMM (`fp8_states`: fc1, fc2 of each local
    expert). Returns them in module order (the order the block's packed reduction uses)."""
    states = []
    if recipe is None or not recipe.delayed:
        return states
    for m in module.modules():
        if getattr(m, "fp8_recipe", None) is not recipe:
            continue
        device = next((p.device for p in m.parameters(recurse=False)), None)
        if hasattr(m, "weight1"):  # GroupedMLP
            m.fp8_states = [
                Fp8DelayedState(recipe.amax_history_len, device)
                for _ in range(2 * m.num_local_experts)
            ]
            states += m.fp8_states
        else:
            m.fp8_state = Fp8DelayedState(recipe.amax_history_len, device)
            states.append(m.fp8_state)
    return states


def state_to_extra(state: Fp8DelayedState) -> torch.Tensor:
    """The state as `_extra_state` bytes (a `torch.save`d dict in a uint8 tensor, as TE's)."""
    buf = io.BytesIO()
    torch.save(state.state_dict(), buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def load_extra(state: Fp8DelayedState, extra) -> None:
    """Load `_extra_state` bytes written by `state_to_extra` (None / empty: nothing saved)."""
    if extra is None or (isinstance(extra, torch.Tensor) and extra.numel() == 0):
        return
    raw = extra.detach().cpu().contiguous().numpy().tobytes()
    state.load_state_dict(torch.load(io.BytesIO(raw), weights_only=True))


def update_delayed_scaling(
    states: list[Fp8DelayedState], recipe, *, forward: bool, group=None
) -> None:
    """Reduce, roll and rescale the forward (`forward=True`) or gradient roles of `states`."""
    if not states:
        return
    roles = _FORWARD_ROLES if forward else _BACKWARD_ROLES
    history = torch.stack([s.amax_history[:, roles] for s in states])  # [n, L, r]
    current = history[:, 0].contiguous()  # [n, r]
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(current, op=dist.ReduceOp.MAX, group=group)
    history[:, 0] = current
    amax = history.amax(dim=1) if recipe.amax_compute_algo == "max" else current  # [n, r]
    history = torch.roll(history, -1, dims=1)
    history[:, 0] = 0
    if forward:
        dtypes = [recipe.casts["input"].dtype, recipe.casts["weight"].dtype]
    else:
        dtypes = [recipe.casts["grad_output"].dtype]
    fp8_max = torch.tensor([torch.finfo(d).max for d in dtypes], dtype=torch.float32)
    scaled_max = (fp8_max * 2.0 ** (-recipe.margin)).to(amax.device)  # [r]
    old = torch.stack([s.scale[roles] for s in states])  # [n, r]
    scale = torch.where(torch.isfinite(amax) & (amax > 0), scaled_max / amax, old)
    scale = torch.where(torch.isinf(scale), torch.finfo(torch.float32).max, scale)
    for i, s in enumerate(states):
        s.amax_history[:, roles] = history[i]
        s.scale[roles] = scale[i]


class _BackwardUpdate(torch.autograd.Function):
    """Identity on the block input whose backward (after every linear of the block has cast its
    output gradient) runs the gradient roles' update.

    forward:  [s, b, h] -> [s, b, h]
    backward: [s, b, h] grad unchanged; update_delayed_scaling(forward=False)
    """

    @staticmethod
    def forward(ctx, x, states, recipe, group):
        ctx.states, ctx.recipe, ctx.group = states, recipe, group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        update_delayed_scaling(ctx.states, ctx.recipe, forward=False, group=ctx.group)
        return grad, None, None, None


@contextlib.contextmanager
def delayed_scaling_region(hidden_states, states, recipe, group):
    """Around a transformer block's layers (Megatron's one fp8_autocast around the block under
    delayed scaling): yields the input to run them on; on exit from a forward with grad, the
    forward roles are updated. Yields `hidden_states` unchanged when there is nothing to do."""
    if not states or not torch.is_grad_enabled():
        yield hidden_states
        return
    yield _BackwardUpdate.apply(hidden_states, states, recipe, group)
    update_delayed_scaling(states, recipe, forward=True, group=group)

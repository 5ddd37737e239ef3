"""Activation checkpointing that replays the forward's RNG streams (re-exported by `random`).

Mirrors `checkpoint` / `CheckpointWithoutOutput` of `megatron.core.tensor_parallel.random`: the
forward runs without a graph; backward re-runs it with the CPU, accelerator and tracker RNG states
of the original forward, so dropout masks match, then back-propagates through the recomputation.
Use `.backward()`, not `torch.autograd.grad` (same restriction as Megatron).
"""

from __future__ import annotations

import torch

from gigatron.core.tensor_parallel._rng_tracker import get_cuda_rng_tracker
from gigatron.core.tensor_parallel.fp8_delayed import recompute_phase
from gigatron.core.tensor_parallel.utils import (
    gather_split_1d_tensor,
    split_tensor_into_1d_equal_chunks,
)


def _get_all_rng_states():
    cuda_state = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return torch.get_rng_state(), cuda_state, get_cuda_rng_tracker().get_states()


def _set_all_rng_states(states) -> None:
    cpu_state, cuda_state, tracker_states = states
    torch.set_rng_state(cpu_state)
    if cuda_state is not None:
        torch.cuda.set_rng_state(cuda_state)
    get_cuda_rng_tracker().set_states(tracker_states)


def _check_valid() -> None:
    if not torch.autograd._is_checkpoint_valid():
        raise RuntimeError(
            "Checkpointing is not compatible with .grad(), please use .backward() if possible"
        )


def _pack(ctx, args) -> None:
    """Save tensor args with save_for_backward and keep the others on ctx."""
    ctx.tensor_slots = [i for i, a in enumerate(args) if torch.is_tensor(a)]
    ctx.other_args = [None if torch.is_tensor(a) else a for a in args]
    ctx.save_for_backward(*(args[i] for i in ctx.tensor_slots))


def _unpack_detached(ctx) -> list:
    """The saved args, tensors detached but keeping their requires_grad flag."""
    args = list(ctx.other_args)
    for slot, saved in zip(ctx.tensor_slots, ctx.saved_tensors):
        detached = saved.detach()
        detached.requires_grad_(saved.requires_grad)
        args[slot] = detached
    return args


def _backward_through(outputs, grad_outputs, inputs) -> tuple:
    outputs = (outputs,) if torch.is_tensor(outputs) else tuple(outputs)
    pairs = [
        (o, g) for o, g in zip(outputs, grad_outputs) if torch.is_tensor(o) and o.requires_grad
    ]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return tuple(a.grad if torch.is_tensor(a) else None for a in inputs)


class CheckpointFunction(torch.autograd.Function):
    """Run `run_function` without storing activations; recompute it in backward."""

    @staticmethod
    def forward(ctx, run_function, distribute_saved_activations, *args):
        ctx.run_function = run_function
        ctx.distribute_saved_activations = distribute_saved_activations
        ctx.rng_states = _get_all_rng_states()
        with torch.no_grad(), recompute_phase("first"):
            outputs = run_function(*args)
        if distribute_saved_activations:
            # Keep only this TP rank's 1-D chunk of the first input until backward (Megatron
            # replaces the tensor's data in place, so the caller's tensor shrinks too).
            first = args[0]
            if first._base is not None:
                raise ValueError("distribute_saved_activations: the first input must not be a view")
            ctx.input_0_shape = first.data.shape
            first.data = split_tensor_into_1d_equal_chunks(first.data, new_buffer=True)
        _pack(ctx, args)
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        _check_valid()
        args = _unpack_detached(ctx)
        if ctx.distribute_saved_activations:
            saved = ctx.saved_tensors[0]
            saved.data = gather_split_1d_tensor(saved.data).view(ctx.input_0_shape)
            args[0] = saved.detach().requires_grad_(saved.requires_grad)
        current = _get_all_rng_states()
        _set_all_rng_states(ctx.rng_states)
        try:
            with torch.enable_grad(), recompute_phase("recompute"):
                outputs = ctx.run_function(*args)
        finally:
            _set_all_rng_states(current)
        return (None, None, *_backward_through(outputs, grad_outputs, args))


def checkpoint(function, distribute_saved_activations: bool, *args):
    """`function(*args)` with its activations recomputed in backward (RNG states replayed)."""
    return CheckpointFunction.apply(function, distribute_saved_activations, *args)


class _CheckpointWithoutOutputFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, checkpoint_obj, *args):
        with torch.no_grad(), recompute_phase("first"):
            outputs = run_function(*args)
        _pack(ctx, args)
        checkpoint_obj.ctx = ctx
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not hasattr(ctx, "outputs"):
            raise RuntimeError(
                "CheckpointWithoutOutput: outputs were not recomputed; call "
                "discard_output_and_register_recompute(hook_tensor) after using the outputs"
            )
        grads = _backward_through(ctx.outputs, grad_outputs, ctx.inputs)
        del ctx.outputs, ctx.inputs
        return (None, None, *grads)


class CheckpointWithoutOutput:
    """Checkpoint whose outputs' storage is freed and refilled just before it is needed.

    Usage: `y = ckpt.checkpoint(fn, x)`; use `y` (e.g. `z = linear(y)`); then
    `ckpt.discard_output_and_register_recompute(z)`. When `z`'s gradient arrives, `fn` is re-run
    (same RNG states) and `y`'s storage is refilled before `linear`'s backward reads it.

    With `ckpt_manager` (a `CheckpointWithoutOutputManager`) the checkpoint registers itself
    after `checkpoint()`, and the manager frees every output and recomputes them all, in forward
    order, from one hook. With `retain_input_tensors=True` an output that shares storage with an
    input (an op returning its input, or a view of it) is not freed: the recompute needs it.
    """

    def __init__(self, fp8=False, ckpt_manager=None, retain_input_tensors: bool = False):
        if fp8 not in (False, None):
            raise ValueError(
                f"CheckpointWithoutOutput(fp8={fp8!r}) is not supported by gigatron "
                "(FP8 recompute needs Transformer Engine)"
            )
        self.ckpt_manager = ckpt_manager
        self.retain_input_tensors = retain_input_tensors
        self.run_function = None
        self.rng_states = None
        self.ctx = None
        self.outputs = None
        self._input_storages: set[int] = set()

    def checkpoint(self, run_function, *args):
        """Run `run_function(*args)` without keeping its activations."""
        self.run_function = run_function
        self.rng_states = _get_all_rng_states()
        if self.retain_input_tensors:
            self._input_storages = {
                a.untyped_storage().data_ptr() for a in args if torch.is_tensor(a)
            }
        outputs = _CheckpointWithoutOutputFunction.apply(run_function, self, *args)
        self.outputs = (outputs,) if torch.is_tensor(outputs) else tuple(outputs)
        if self.ckpt_manager is not None:
            self.ckpt_manager.add_checkpoint(self)
        return outputs

    def _recompute(self, _grad):
        if self.ctx is None:  # already recomputed (by this hook or the manager's)
            return
        _check_valid()
        args = _unpack_detached(self.ctx)
        current = _get_all_rng_states()
        _set_all_rng_states(self.rng_states)
        try:
            with torch.enable_grad(), recompute_phase("recompute"):
                outputs = self.run_function(*args)
        finally:
            _set_all_rng_states(current)
        recomputed = (outputs,) if torch.is_tensor(outputs) else tuple(outputs)
        for output, again in zip(self.outputs, recomputed):
            storage = output.untyped_storage()
            if storage.data_ptr() == again.untyped_storage().data_ptr():
                continue  # retained (aliases an input): nothing was freed
            storage.resize_(again.untyped_storage().size())
            with torch.no_grad():
                storage.copy_(again.untyped_storage())
        self.ctx.outputs = recomputed
        self.ctx.inputs = args
        self.outputs = None
        self.ctx = None
        self.run_function = None
        self.rng_states = None

    def _discard_outputs(self) -> None:
        """Free the outputs' storage (keeping outputs that alias an input when retaining them)."""
        for output in self.outputs:
            storage = output.untyped_storage()
            if self.retain_input_tensors and storage.data_ptr() in self._input_storages:
                continue
            storage.resize_(0)

    def discard_output_and_register_recompute(self, hook_tensor: torch.Tensor) -> None:
        """Free the outputs' storage; recompute them when `hook_tensor`'s gradient is computed.

        Does nothing under a manager: its `discard_all_outputs_and_register_unified_recompute`
        frees and hooks every checkpoint at once.
        """
        if self.ckpt_manager is not None:
            return
        self._discard_outputs()
        if hook_tensor.requires_grad:
            hook_tensor.register_hook(self._recompute)


class CheckpointWithoutOutputManager:
    """Frees the outputs of several `CheckpointWithoutOutput`s and recomputes them together.

    For chained checkpoints (one's output is the next one's input) inside a block:
    `mgr = CheckpointWithoutOutputManager()`, each `CheckpointWithoutOutput(ckpt_manager=mgr)
    .checkpoint(fn, x)` registers itself, then
    `mgr.discard_all_outputs_and_register_unified_recompute(out)` frees them all; when `out`'s
    gradient arrives every checkpoint is recomputed in forward order.
    """

    def __init__(self):
        self.checkpoints: list[CheckpointWithoutOutput] = []
        # Set by the block before each layer: True keeps that layer's block-boundary output.
        self.is_last_layer_in_recompute_block = False

    def add_checkpoint(self, ckpt: CheckpointWithoutOutput) -> None:
        """Register a checkpoint whose `checkpoint()` has run."""
        if not isinstance(ckpt, CheckpointWithoutOutput):
            raise TypeError(
                f"add_checkpoint expects a CheckpointWithoutOutput, got {type(ckpt).__name__}"
            )
        if ckpt.outputs is None:
            raise ValueError("CheckpointWithoutOutput must call checkpoint() before being added")
        self.checkpoints.append(ckpt)

    def discard_all_outputs_and_register_unified_recompute(self, hook_tensor: torch.Tensor):
        """Free every registered output; recompute all of them when `hook_tensor`'s grad comes."""
        for ckpt in self.checkpoints:
            ckpt._discard_outputs()
        if hook_tensor.requires_grad:
            hook_tensor.register_hook(self._unified_recompute_hook)

    def _unified_recompute_hook(self, _grad):
        for ckpt in self.checkpoints:
            ckpt._recompute(None)

"""Run a schedule table (see `_schedule_table`) on one rank: compute, p2p and grad-sync hooks.

The order of work is data; this module only says how to run a step. Chunk c on pipeline rank r is
virtual stage c * pp + r of the whole model: forward inputs come from the previous virtual stage
(rank r - 1, or the last rank's chunk c - 1 when r = 0) and gradients from the next.

Communication follows `_schedule_table.slot_plan`: before each slot one batch carries the sends of
the previous slot and the receives of this one (Megatron's pairing). Only the receives are waited
for on gloo (sends finish in the background, waited at the end); NCCL's grouped p2p waits for the
whole batch, which the slot grouping also survives. With `config.pipeline_timeline` recording
(`timeline.py`) each step and each exchange is stamped. Each message carries a tag naming the
receiving (microbatch, chunk) and the direction, so gloo can never pair the wrong tensors.

Gradient sync (Megatron's rules): backward passes run under `config.no_sync_func()`; sync is
re-enabled for the last microbatch of each chunk, `grad_sync_func` / `param_sync_func` are called
per chunk (pipelined schedules only), then `finalize_model_grads_func(models, num_tokens)`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gigatron.core.pipeline_parallel._schedule_table import (
    BACKWARD,
    FORWARD,
    Slot,
    Step,
    Transfer,
    slot_plan,
)
from gigatron.core.pipeline_parallel._steps import (
    backward_step,
    deallocate_output_tensor,
    forward_step,
)
from gigatron.core.pipeline_parallel.p2p_communication import Message, P2PCommunicator


@dataclass
class RunSpec:
    """Everything one schedule call needs besides the table."""

    forward_step_func: object
    data_iterators: list
    models: list
    num_microbatches: int
    config: object
    pp_rank: int
    pp_size: int
    cp_size: int
    recv_shape: tuple  # forward receive [s, b, h]
    grad_shape: tuple  # backward receive [s, b, h]
    forward_only: bool
    collect_non_loss_data: bool
    first_val_step: bool | None
    warmup: int  # forwards before the first backward (slot grouping, partial checkpoints)
    sync_hooks: bool  # call grad_sync_func / param_sync_func (pipelined schedules)
    interleaved: bool
    comm: P2PCommunicator | None


class _GradSync:
    """The no_sync context and per-chunk sync hooks, entered/left as the schedule demands."""

    def __init__(self, spec: RunSpec) -> None:
        cfg, n = spec.config, len(spec.models)
        no_sync = cfg.no_sync_func
        if isinstance(no_sync, list):
            funcs = no_sync

            def no_sync():
                stack = contextlib.ExitStack()
                for f in funcs:
                    stack.enter_context(f())
                return stack

        self._no_sync = no_sync or contextlib.nullcontext
        self._ctx = None
        use = spec.sync_hooks and not spec.forward_only
        self.grad_sync = _per_chunk(cfg.grad_sync_func, n) if use else None
        self.param_sync = _per_chunk(cfg.param_sync_func, n) if use and spec.interleaved else None
        self.synced: set[int] = set()

    def disable(self) -> None:
        if self._ctx is None:
            self._ctx = self._no_sync()
            self._ctx.__enter__()

    def enable(self) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(None, None, None)
            self._ctx = None


def _collective_device() -> torch.device:
    if dist.is_initialized() and "nccl" in str(dist.get_backend()):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _per_chunk(func, n: int):
    if func is None:
        return None
    return list(func) if isinstance(func, list) else [func] * n


class _Runner:
    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.num_chunks = len(spec.models)
        self.sync = _GradSync(spec)
        self.received: dict[Transfer, torch.Tensor] = {}
        self.produced: dict[Transfer, torch.Tensor] = {}
        self.saved: dict[tuple[int, int], tuple] = {}  # (mb, chunk) -> (input, output)
        self.store: list = []
        # where finalize_model_grads can reduce it: the GPU under NCCL
        self.total_num_tokens = torch.zeros([], dtype=torch.int, device=_collective_device())
        self.num_forwards = 0

    # -- position of a chunk in the whole pipeline (virtual stage = chunk * pp + rank)
    def stage(self, chunk: int) -> int:
        return chunk * self.spec.pp_size + self.spec.pp_rank

    def is_last(self, chunk: int) -> bool:
        return self.stage(chunk) == self.spec.pp_size * self.num_chunks - 1

    def message(self, t: Transfer, tensor: torch.Tensor | None = None) -> Message:
        """Activations travel to the next rank, gradients to the previous one (ring-wise).

        The tag names the receiving (microbatch, chunk), so gloo cannot mix up two tensors.
        """
        forward = t.kind == FORWARD
        to_next = forward if tensor is not None else not forward
        shape = self.spec.recv_shape if forward else self.spec.grad_shape
        tag = t.microbatch * self.num_chunks + t.stage // self.spec.pp_size
        return Message(to_next, tensor, shape=shape, tag=tag)

    # -- steps
    def forward(self, step: Step) -> None:
        spec, (mb, chunk) = self.spec, (step.microbatch, step.chunk)
        stage = self.stage(chunk)
        input_tensor = self.received.pop(Transfer(FORWARD, mb, stage), None)
        if self.sync.param_sync is not None and mb == 0:
            self.sync.param_sync[chunk](spec.models[chunk].parameters())
        checkpoint = None
        partial = spec.config.num_microbatches_with_partial_activation_checkpoints
        if partial is not None and spec.pp_size > 1:
            checkpoint = self.num_forwards % (spec.warmup + 1) >= partial
        first_mb = mb == 0
        if spec.first_val_step is not None and spec.forward_only:
            first_mb = spec.first_val_step and first_mb
        output, num_tokens = forward_step(
            spec.forward_step_func,
            spec.data_iterators[chunk],
            spec.models[chunk],
            spec.num_microbatches,
            input_tensor,
            self.store,
            spec.config,
            spec.cp_size,
            spec.collect_non_loss_data,
            checkpoint_activations_microbatch=checkpoint,
            is_first_microbatch=first_mb,
            current_microbatch=mb,
            vp_stage=chunk if spec.interleaved else None,
            is_last_stage=self.is_last(chunk),
        )
        self.num_forwards += 1
        self.total_num_tokens += num_tokens.to(self.total_num_tokens.device)
        if not self.is_last(chunk):
            _check_activation(output, stage, spec)
            # detach(): an alias that keeps the data even if deallocate frees `output.data`
            self.produced[Transfer(FORWARD, mb, stage + 1)] = output.detach()
        if not spec.forward_only:
            self.saved[(mb, chunk)] = (input_tensor, output)
            if not self.is_last(chunk):
                deallocate_output_tensor(output, spec.config.deallocate_pipeline_outputs)

    def backward(self, step: Step) -> None:
        spec, (mb, chunk) = self.spec, (step.microbatch, step.chunk)
        stage = self.stage(chunk)
        last_mb = mb == spec.num_microbatches - 1
        if last_mb and self.sync.grad_sync is None:
            self.sync.enable()  # let DDP's backward hooks reduce this chunk's grads
        output_grad = self.received.pop(Transfer(BACKWARD, mb, stage), None)
        input_tensor, output = self.saved.pop((mb, chunk))
        input_grad = backward_step(input_tensor, output, output_grad, None, spec.config)
        if stage > 0 and input_grad is None and isinstance(input_tensor, torch.Tensor):
            raise ValueError(
                f"pipeline stage {stage}: its output does not depend on the activations it "
                f"received from stage {stage - 1} (no gradient reached them). A model built with "
                "pre_process=True embeds the tokens itself and ignores its input; build each "
                "stage's model with pre_process=parallel_state.is_pipeline_first_stage()"
            )
        if stage > 0:
            self.produced[Transfer(BACKWARD, mb, stage - 1)] = input_grad
        if last_mb and self.sync.grad_sync is not None:
            self.sync.enable()
            self.sync.grad_sync[chunk](spec.models[chunk].parameters())
            self.sync.synced.add(chunk)
        self.sync.disable()

    def run(self, plan: list[Slot]) -> None:
        comm = self.spec.comm
        timeline = getattr(self.spec.config, "pipeline_timeline", None)
        clock = timeline if timeline is not None and timeline.recording else None
        self.sync.disable()
        pending: list[Message] = []
        sent: list[Transfer] = []  # what `pending` carries, for the timeline
        for slot in plan:
            if slot.separate and pending:
                self._exchange(clock, pending, sent, [])
                pending, sent = [], []
            if slot.recvs or pending:
                got = self._exchange(clock, pending, sent, slot.recvs)
                self.received.update(zip(slot.recvs, got))
            for step in slot.steps:
                start = clock.now() if clock is not None else 0.0
                (self.forward if step.kind == FORWARD else self.backward)(step)
                if clock is not None:
                    clock.add(step.kind, f"{step!r}", start, clock.now(),
                              microbatch=step.microbatch, chunk=step.chunk)  # fmt: skip
            pending = [self.message(t, self.produced.pop(t)) for t in slot.sends]
            sent = slot.sends
        if pending:
            self._exchange(clock, pending, sent, [])
        if comm is not None:
            start = clock.now() if clock is not None else 0.0
            comm.wait_all()
            if clock is not None and sent:
                clock.add("send", "wait sends", start, clock.now())
        self.sync.enable()
        if self.sync.grad_sync is not None:
            for chunk in range(self.num_chunks):
                if chunk not in self.sync.synced:
                    self.sync.grad_sync[chunk](self.spec.models[chunk].parameters())

    def _exchange(self, clock, sends: list[Message], sent: list[Transfer], recvs: list[Transfer]):
        """Post `sends`, wait for `recvs`; on the timeline a "recv" span (or "send" without
        receives) named after the transfers (F: activation, B: gradient, of microbatch.stage)."""
        start = clock.now() if clock is not None else 0.0
        got = self.spec.comm.exchange(sends, [self.message(t) for t in recvs])
        if clock is not None:
            names = [f"{t.kind[0].upper()}{t.microbatch}@{t.stage}" for t in sent]
            names_in = [f"{t.kind[0].upper()}{t.microbatch}@{t.stage}" for t in recvs]
            label = " ".join([f"send {' '.join(names)}"] * bool(names)
                             + [f"recv {' '.join(names_in)}"] * bool(names_in))  # fmt: skip
            clock.add("recv" if recvs else "send", label, start, clock.now(),
                      sends=names, recvs=names_in)  # fmt: skip
        return got


def _check_activation(output, stage: int, spec: RunSpec) -> None:
    """A stage that is not the last sends activations [s, b, h]; a loss or logits (a model built
    with post_process=True) would be sent on, or allocated from, as if they were."""
    hidden = spec.grad_shape[-1] if spec.grad_shape else None
    if isinstance(output, torch.Tensor) and output.dim() == 3 and output.shape[-1] == hidden:
        return
    got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
    num_stages = spec.pp_size * len(spec.models)
    raise ValueError(
        f"pipeline stage {stage} of {num_stages} is not the last stage, so the schedule expects "
        f"activations [s, b, h] {tuple(spec.grad_shape)} from its forward_step_func, but it "
        f"returned {got}: a loss or logits, as a model built with post_process=True computes. "
        "Build each stage's model with post_process=parallel_state.is_pipeline_last_stage() "
        "and pre_process=parallel_state.is_pipeline_first_stage()"
    )


def run_table(spec: RunSpec, steps: list[Step]):
    """Run `steps` on this rank; return (forward_data_store, total_num_tokens)."""
    plan = slot_plan(
        steps, spec.warmup, spec.pp_size, spec.pp_rank, len(spec.models),
        pair_steady=spec.interleaved,
    )  # fmt: skip
    runner = _Runner(spec)
    runner.run(plan)
    return runner.store, runner.total_num_tokens

"""Run a schedule table (see `_schedule_table`) on one rank: compute, p2p and grad-sync hooks.

The order of work is data; this module only says how to run a step. Chunk c on pipeline rank r is
virtual stage c * pp + r of the whole model: forward inputs come from the previous virtual stage
(rank r - 1, or the last rank's chunk c - 1 when r = 0) and gradients from the next.

Communication: a send is started right after the step that produced it and never waited for
until the schedule ends; when the next step needs a receive, the pending sends go out in the same
batch as that receive (Megatron's send_forward_recv_backward pairing). A rank therefore blocks
only on receives, and a table in which every input is produced earlier cannot deadlock. Each
message carries a tag naming (microbatch, chunk, direction), so gloo can never pair the wrong
tensors.

Gradient sync (Megatron's rules): backward passes run under `config.no_sync_func()`; sync is
re-enabled for the last microbatch of each chunk, `grad_sync_func` / `param_sync_func` are called
per chunk (pipelined schedules only), then `finalize_model_grads_func(models, num_tokens)`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from gigatron.core.pipeline_parallel._schedule_table import FORWARD, Step
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
    warmup: int  # forwards before the first backward (for partial activation checkpoints)
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


def _per_chunk(func, n: int):
    if func is None:
        return None
    return list(func) if isinstance(func, list) else [func] * n


def _tag(microbatch: int, chunk: int, num_chunks: int) -> int:
    """Tag of the message feeding (microbatch, chunk) on the receiving rank."""
    return microbatch * num_chunks + chunk


class _Runner:
    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.num_chunks = len(spec.models)
        self.sync = _GradSync(spec)
        self.pending: list[Message] = []
        self.saved: dict[tuple[int, int], tuple] = {}  # (mb, chunk) -> (input, output)
        self.store: list = []
        self.total_num_tokens = torch.zeros([], dtype=torch.int)
        self.num_forwards = 0

    # -- position of a chunk in the whole pipeline
    def first_stage(self, chunk: int) -> bool:
        return self.spec.pp_rank == 0 and chunk == 0

    def last_stage(self, chunk: int) -> bool:
        return self.spec.pp_rank == self.spec.pp_size - 1 and chunk == self.num_chunks - 1

    def needs_recv(self, step: Step) -> bool:
        if step.kind == FORWARD:
            return not self.first_stage(step.chunk)
        return not self.last_stage(step.chunk)

    def recv(self, msg: Message) -> torch.Tensor:
        sends, self.pending = self.pending, []
        return self.spec.comm.exchange(sends, [msg])[0]

    def flush(self) -> None:
        if self.pending:
            sends, self.pending = self.pending, []
            self.spec.comm.exchange(sends, [])

    # -- steps
    def forward(self, step: Step) -> None:
        spec, (mb, chunk) = self.spec, (step.microbatch, step.chunk)
        input_tensor = None
        if not self.first_stage(chunk):
            tag = _tag(mb, chunk, self.num_chunks)
            input_tensor = self.recv(Message(False, shape=spec.recv_shape, tag=tag))
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
            is_last_stage=self.last_stage(chunk),
        )
        self.num_forwards += 1
        self.total_num_tokens += num_tokens
        if not self.last_stage(chunk):
            # The last rank's chunk c feeds rank 0's chunk c + 1.
            to_chunk = chunk + 1 if spec.pp_rank == spec.pp_size - 1 else chunk
            tag = _tag(mb, to_chunk, self.num_chunks)
            # detach(): an alias that keeps the data even if deallocate frees `output.data`
            self.pending.append(Message(True, output.detach(), shape=spec.recv_shape, tag=tag))
        if not spec.forward_only:
            self.saved[(mb, chunk)] = (input_tensor, output)

    def backward(self, step: Step) -> None:
        spec, (mb, chunk) = self.spec, (step.microbatch, step.chunk)
        last_mb = mb == spec.num_microbatches - 1
        if last_mb and self.sync.grad_sync is None:
            self.sync.enable()  # let DDP's backward hooks reduce this chunk's grads
        output_grad = None
        if not self.last_stage(chunk):
            tag = _tag(mb, chunk, self.num_chunks)
            output_grad = self.recv(Message(True, shape=spec.grad_shape, tag=tag))
        input_tensor, output = self.saved.pop((mb, chunk))
        input_grad = backward_step(input_tensor, output, output_grad, None, spec.config)
        if not self.first_stage(chunk):
            to_chunk = chunk - 1 if spec.pp_rank == 0 else chunk
            tag = _tag(mb, to_chunk, self.num_chunks)
            self.pending.append(Message(False, input_grad, shape=spec.grad_shape, tag=tag))
        if last_mb and self.sync.grad_sync is not None:
            self.sync.enable()
            self.sync.grad_sync[chunk](spec.models[chunk].parameters())
            self.sync.synced.add(chunk)
        self.sync.disable()

    def run(self, steps: list[Step]) -> None:
        self.sync.disable()
        for i, step in enumerate(steps):
            if step.kind == FORWARD:
                self.forward(step)
            else:
                self.backward(step)
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            if nxt is None or not self.needs_recv(nxt):
                self.flush()  # nothing to pair the sends with: send now
            if step.kind == FORWARD and not self.spec.forward_only:
                _, output = self.saved[(step.microbatch, step.chunk)]
                if not self.last_stage(step.chunk):
                    deallocate_output_tensor(output, self.spec.config.deallocate_pipeline_outputs)
        self.flush()
        if self.spec.comm is not None:
            self.spec.comm.wait_all()
        self.sync.enable()
        if self.sync.grad_sync is not None:
            for chunk in range(self.num_chunks):
                if chunk not in self.sync.synced:
                    self.sync.grad_sync[chunk](self.spec.models[chunk].parameters())


def run_table(spec: RunSpec, steps: list[Step]):
    """Run `steps` on this rank; return (forward_data_store, total_num_tokens)."""
    runner = _Runner(spec)
    runner.run(steps)
    return runner.store, runner.total_num_tokens

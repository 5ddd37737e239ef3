"""Send and receive activations and gradients between adjacent pipeline stages.

Mirrors `megatron.core.pipeline_parallel.p2p_communication.P2PCommunicator`: the same method
names and arguments (`recv_forward`, `send_forward_recv_backward`, ...), each one batched
isend/irecv (`config.batch_p2p_comm`, default) or plain isend/irecv, waited before returning.

"next" is the following rank of the pipeline group and "prev" the preceding one, both ring-wise,
so that the last rank's chunk c feeds rank 0's chunk c + 1 under interleaving. Activations travel
prev -> next, gradients next -> prev. Receive buffers are `torch.empty(shape,
dtype=config.pipeline_dtype, requires_grad=True)` on the CPU for gloo and on the current CUDA
device otherwise. With `config.variable_seq_lengths` a shape header is exchanged before each
tensor: int64 [s, b, h, check word] (Megatron sends [s, b, h]); a receiver refuses a header whose
check word does not match before allocating anything from it (gloo lets a shorter message land in
a longer buffer, leaving the rest as it was).

Beyond Megatron, `exchange()` takes any number of sends and receives with tags and waits only for
the receives (sends complete in the background); the schedule executor uses it so that a send
never blocks a rank.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

Shape = list[int] | tuple[int, ...] | torch.Size


class Message(NamedTuple):
    """One point-to-point transfer: `tensor` to send (None when receiving) to/from `to_next`."""

    to_next: bool  # True: peer is the next rank; False: the previous rank
    tensor: torch.Tensor | None = None
    shape: Shape | None = None  # receive shape (ignored with variable_seq_lengths)
    tag: int = 0


def _tag(msg: Message, is_send: bool, is_shape: bool) -> int:
    """Wire tag: the user tag, the direction (activation or gradient) and shape-or-data.

    With pp = 2 the next and the previous rank are the same peer; the direction bit keeps an
    activation and a gradient travelling the same way apart (gloo matches on tags).
    """
    is_grad = msg.to_next != is_send  # sent to prev / received from next
    return (msg.tag * 2 + int(is_grad)) * 2 + int(is_shape)


_HEADER_SALT = 0x6769676174726F6E  # "gigatron": a header that is not one fails the check


def _check_word(s: int, b: int, h: int) -> int:
    return (s * 1_000_003 + b * 10_007 + h * 101 + _HEADER_SALT) % (1 << 62)


def _shape_header(shape, device) -> torch.Tensor:
    """int64 [s, b, h, check word] describing a pipeline tensor of `shape` [s, b, h]."""
    s, b, h = (int(d) for d in shape)
    return torch.tensor([s, b, h, _check_word(s, b, h)], dtype=torch.int64, device=device)


def _shape_from_header(header: torch.Tensor, source: str) -> list[int]:
    """[s, b, h] from a received header, validated before anything is allocated from it."""
    s, b, h, check = header.tolist()
    if min(s, b, h) < 1 or check != _check_word(s, b, h):
        raise ValueError(
            f"the pipeline shape header received from the {source} stage is not valid "
            f"({[s, b, h, check]}; expected [s, b, h, check word]): the stages disagree on what "
            "is sent (a stage sending a loss instead of activations, or stages running different "
            "schedules); no buffer was allocated from it"
        )
    return [s, b, h]


def is_single_shape(x) -> bool:
    """True for one shape (`torch.Size` or a list/tuple of ints), False for a list of shapes."""
    if isinstance(x, torch.Size):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(d, int) for d in x)


class P2PCommunicator:
    """Point-to-point exchanges between consecutive stages of `pp_group`."""

    def __init__(self, pp_group: dist.ProcessGroup, config) -> None:
        self.pp_group = pp_group
        self.config = config
        # shapes travel ahead of the data: varying sequences, or a standalone MTP stage
        self.variable_shapes = bool(
            getattr(config, "variable_seq_lengths", False)
            or getattr(config, "mtp_standalone", False)
        )
        size, rank = pp_group.size(), pp_group.rank()
        self.next_rank = dist.get_global_rank(pp_group, (rank + 1) % size)
        self.prev_rank = dist.get_global_rank(pp_group, (rank - 1) % size)
        self.virtual_pipeline_model_parallel_size = getattr(
            config, "virtual_pipeline_model_parallel_size", None
        )
        backend = dist.get_backend(pp_group)
        self.device = (
            torch.device("cuda", torch.cuda.current_device())
            if "nccl" in str(backend)
            else torch.device("cpu")
        )
        self._use_tags = "gloo" in str(backend)  # NCCL matches by order and ignores tags
        self._pending_sends: list = []  # (work, tensor) kept alive until complete

    # ------------------------------------------------------------------ properties
    @property
    def is_pp_first_stage(self) -> bool:
        return self.pp_group.rank() == 0

    @property
    def is_pp_last_stage(self) -> bool:
        return self.pp_group.rank() == self.pp_group.size() - 1

    @property
    def total_stages(self) -> int:
        return self.pp_group.size()

    @property
    def current_stage(self) -> int:
        return self.pp_group.rank()

    # ------------------------------------------------------------------ core exchange
    def _launch(self, ops: list[tuple[bool, torch.Tensor, bool, int]]) -> list:
        """Start (is_send, tensor, to_next, tag) ops as one batch; return their works."""
        if not ops:
            return []
        p2p_ops = [
            dist.P2POp(
                dist.isend if is_send else dist.irecv,
                tensor,
                self.next_rank if to_next else self.prev_rank,
                self.pp_group,
                tag if self._use_tags else 0,
            )
            for is_send, tensor, to_next, tag in ops
        ]
        if self.config.batch_p2p_comm:
            return list(dist.batch_isend_irecv(p2p_ops))
        return [op.op(op.tensor, op.peer, op.group, op.tag) for op in p2p_ops]

    def _recv_buffer(self, shape: Shape) -> torch.Tensor:
        dtype = self.config.pipeline_dtype
        if dtype is None:
            raise RuntimeError(
                "pipeline_dtype must be set in the model config to receive pipeline tensors "
                "(pipeline_model_parallel_size > 1)"
            )
        return torch.empty(tuple(shape), dtype=dtype, device=self.device, requires_grad=True)

    def _check_send(self, msg: Message) -> None:
        t = msg.tensor
        if self.variable_shapes and t.dim() != 3:
            raise ValueError(
                f"pipeline tensors are [s, b, h]; got shape {tuple(t.shape)}, which the shape "
                "header of variable_seq_lengths cannot describe"
            )
        if t.dtype != self.config.pipeline_dtype:
            raise ValueError(
                f"pipeline tensor dtype ({t.dtype}) must equal config.pipeline_dtype "
                f"({self.config.pipeline_dtype})"
            )
        if msg.shape is not None and not self.variable_shapes:
            if tuple(t.shape) != tuple(msg.shape):
                raise ValueError(
                    f"pipeline tensor shape {tuple(t.shape)} differs from the expected "
                    f"{tuple(msg.shape)} (seq_length // cp [// tp], micro_batch_size, "
                    "hidden_size); set config.variable_seq_lengths=True for varying shapes"
                )

    def _run(self, send_ops: list, recv_ops: list) -> None:
        """Launch sends + receives together, wait for the receives, keep the sends pending."""
        works = self._launch(send_ops + recv_ops)
        if len(works) == len(send_ops) + len(recv_ops):
            send_works, recv_works = works[: len(send_ops)], works[len(send_ops) :]
        else:  # a coalesced batch (NCCL) has one work for everything
            send_works, recv_works = [], works
        for w in recv_works:
            w.wait()
        self._pending_sends += [(w, op[1]) for w, op in zip(send_works, send_ops)]
        self._pending_sends = [(w, t) for w, t in self._pending_sends if not w.is_completed()]

    def exchange(
        self, sends: list[Message], recvs: list[Message], *, wait_sends: bool = False
    ) -> list[torch.Tensor]:
        """Start all `sends`, receive all `recvs` (in order), return the received tensors.

        Only the receives are waited for unless `wait_sends`; pending sends are completed by
        `wait_all()`. Sends go out as `t.detach()`, so freeing the sender's `.data` afterwards
        (deallocate_pipeline_outputs) cannot corrupt a send in flight.
        """
        for msg in sends:
            self._check_send(msg)
        data = [m.tensor.detach() for m in sends]
        send_ops = [(True, d, m.to_next, _tag(m, True, False)) for d, m in zip(data, sends)]
        shapes = [m.shape for m in recvs]
        if self.variable_shapes and (sends or recvs):
            # Shapes first. NCCL: in a batch of their own, data in the next one (Megatron's
            # order; a batch waits for all its ops). gloo: the data sends go out with the shapes
            # - sends never block there, so no rank waits on a send it has not started.
            shape_ops = [
                (True, _shape_header(d.shape, self.device), m.to_next, _tag(m, True, True))
                for d, m in zip(data, sends)
            ]
            if self._use_tags:  # gloo
                shape_ops, send_ops = shape_ops + send_ops, []
            bufs = [torch.full((4,), -1, dtype=torch.int64, device=self.device) for _ in recvs]
            recv_ops = [(False, b, m.to_next, _tag(m, False, True)) for b, m in zip(bufs, recvs)]
            self._run(shape_ops, recv_ops)
            shapes = [
                _shape_from_header(b, "next" if m.to_next else "previous")
                for b, m in zip(bufs, recvs)
            ]
        bufs = [self._recv_buffer(s) for s in shapes]
        recv_ops = [(False, b, m.to_next, _tag(m, False, False)) for b, m in zip(bufs, recvs)]
        self._run(send_ops, recv_ops)
        if wait_sends:
            self.wait_all()
        return bufs

    def wait_all(self) -> None:
        """Wait for every send still in flight."""
        for work, _ in self._pending_sends:
            work.wait()
        self._pending_sends = []

    # ------------------------------------------------------------------ Megatron's API
    def _communicate(
        self,
        *,
        tensor_send_next: torch.Tensor | None,
        tensor_send_prev: torch.Tensor | None,
        recv_prev: bool,
        recv_next: bool,
        tensor_shape: Shape | None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One batched exchange with both neighbours; waits for everything (sends too)."""
        receiving = recv_prev or recv_next
        if receiving and tensor_shape is None and not self.variable_shapes:
            raise RuntimeError(
                "tensor_shape must be given to receive: (seq_length, micro_batch_size, hidden)"
            )
        sends = [Message(True, tensor_send_next)] if tensor_send_next is not None else []
        if tensor_send_prev is not None:
            sends.append(Message(False, tensor_send_prev))
        recvs = ([Message(False, shape=tensor_shape)] if recv_prev else []) + (
            [Message(True, shape=tensor_shape)] if recv_next else []
        )
        got = self.exchange(sends, recvs, wait_sends=True)
        from_prev = got.pop(0) if recv_prev else None
        from_next = got.pop(0) if recv_next else None
        return from_prev, from_next

    def _recv(self, tensor_shapes, skip: bool, from_prev: bool, send=None, send_to_next=True):
        """Receive one tensor per shape (None where `skip`), optionally sending `send` first."""
        single = is_single_shape(tensor_shapes)
        shapes = [tensor_shapes] if single else list(tensor_shapes)
        sends = send if isinstance(send, list) else [send] * len(shapes)
        out = []
        for shape, t in zip(shapes, sends):
            if skip:
                out.append(None)
                continue
            got = self._communicate(
                tensor_send_next=t if send_to_next else None,
                tensor_send_prev=None if send_to_next else t,
                recv_prev=from_prev,
                recv_next=not from_prev,
                tensor_shape=shape,
            )
            out.append(got[0] if from_prev else got[1])
        return out[0] if single else out

    def _send(self, tensors, skip: bool, to_next: bool) -> None:
        for t in tensors if isinstance(tensors, list) else [tensors]:
            if not skip:
                self._communicate(
                    tensor_send_next=t if to_next else None,
                    tensor_send_prev=None if to_next else t,
                    recv_prev=False,
                    recv_next=False,
                    tensor_shape=None,
                )

    def recv_forward(self, tensor_shapes, is_first_stage: bool):
        """Activation(s) from the previous stage; None on the first stage."""
        return self._recv(tensor_shapes, is_first_stage, from_prev=True)

    def recv_backward(self, tensor_shapes, is_last_stage: bool):
        """Output gradient(s) from the next stage; None on the last stage."""
        return self._recv(tensor_shapes, is_last_stage, from_prev=False)

    def send_forward(self, output_tensors, is_last_stage: bool) -> None:
        """Send activation(s) to the next stage (nothing on the last stage)."""
        self._send(output_tensors, is_last_stage, to_next=True)

    def send_backward(self, input_tensor_grads, is_first_stage: bool) -> None:
        """Send input gradient(s) to the previous stage (nothing on the first stage)."""
        self._send(input_tensor_grads, is_first_stage, to_next=False)

    def send_forward_recv_backward(self, output_tensors, tensor_shapes, is_last_stage: bool):
        """Send activation(s) to next and receive their gradient(s) from next, batched."""
        return self._recv(
            tensor_shapes, is_last_stage, from_prev=False, send=output_tensors, send_to_next=True
        )

    def send_backward_recv_forward(self, input_tensor_grads, tensor_shapes, is_first_stage: bool):
        """Send input gradient(s) to prev and receive the next activation(s) from prev, batched."""
        return self._recv(
            tensor_shapes,
            is_first_stage,
            from_prev=True,
            send=input_tensor_grads,
            send_to_next=False,
        )

    def send_forward_recv_forward(
        self, output_tensor, recv_prev: bool, tensor_shape: Shape, overlap_p2p_comm: bool = False
    ):
        """Send to next and receive from prev (interleaved schedule), batched.

        `overlap_p2p_comm=True` returns `(tensor, wait_handles)` as Megatron does; gigatron
        completes the exchange before returning, so the handle dict is empty.
        """
        got = self._communicate(
            tensor_send_next=output_tensor,
            tensor_send_prev=None,
            recv_prev=recv_prev,
            recv_next=False,
            tensor_shape=tensor_shape,
        )[0]
        return (got, {}) if overlap_p2p_comm else got

    def send_backward_recv_backward(
        self,
        input_tensor_grad,
        recv_next: bool,
        tensor_shape: Shape,
        overlap_p2p_comm: bool = False,
    ):
        """Send to prev and receive from next (interleaved schedule), batched.

        `overlap_p2p_comm=True` returns `(tensor, wait_handles)` (empty: already complete).
        """
        got = self._communicate(
            tensor_send_next=None,
            tensor_send_prev=input_tensor_grad,
            recv_prev=False,
            recv_next=recv_next,
            tensor_shape=tensor_shape,
        )[1]
        return (got, {}) if overlap_p2p_comm else got

    def send_forward_backward_recv_forward_backward(
        self, output_tensor, input_tensor_grad, recv_prev: bool, recv_next: bool, tensor_shape
    ):
        """Send to both neighbours and receive from both, batched: (from_prev, from_next)."""
        return self._communicate(
            tensor_send_next=output_tensor,
            tensor_send_prev=input_tensor_grad,
            recv_prev=recv_prev,
            recv_next=recv_next,
            tensor_shape=tensor_shape,
        )

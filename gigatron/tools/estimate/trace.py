"""What one microbatch's forward and backward run on a rank, traced on the meta device.

`trace_chunk(args, chunk)` runs the rank's real chunk (built by `world.build_chunks`) forward and
backward on meta tensors under `OpTrace`: nothing is computed or allocated, but every aten op is
seen with its shapes. The trace lists

    gemms        (m, n, k, batch, layout) of each mm / addmm / bmm / _grouped_mm (batch: the
                 groups; `_grouped_gemm`): 2·m·n·k·batch FLOPs;
                 layout "nn" / "nt" / "tn" / "tt": which operand is read transposed
    attention    (b, heads, s_q, s_kv, head dim, causal, forward|backward) per SDPA call; the
                 call is replaced by a shape-only autograd function (meta SDPA would run the
                 math path and show its s² matrices as GEMMs)
    collectives  (kind, bytes per rank, group size, group name) of each c10d op
    other        bytes read + written by every other kernel-launching op, and their count;
                 the chunked cross entropy's three elementwise helpers (compiled on CUDA, where
                 `compiled=None` puts them, so each is one fused kernel) count as one op reading
                 its inputs and writing its outputs once, not as the ~20 eager fp32 [c, V] passes
                 meta would run (`--cross-entropy-loss-fusion`: 73 of gpt-125m's 94 GB)

`timing.py` prices a trace with a calibration table; its FLOPs and bytes are the rank's
per-microbatch work as gigatron runs it (GQA, SwiGLU, MoE, recompute included; routed MoE
layers traced with a balanced router, `moe_trace.py`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gigatron.core import parallel_state as ps
from gigatron.tools.estimate.moe_trace import BalancedRouting, cuda_grouped_gemm

_GEMMS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"}
_FREE = (  # ops that launch no kernel: views, metadata, aliasing
    "view", "_unsafe_view", "t", "transpose", "permute", "expand", "detach", "unsqueeze",
    "squeeze", "select", "slice", "split", "split_with_sizes", "alias", "as_strided",
    "new_empty", "empty", "empty_like", "empty_strided", "chunk", "unbind", "lift_fresh",
    "_reshape_alias", "reshape", "narrow", "diagonal", "view_as", "unflatten", "set_",
)  # fmt: skip


@dataclass
class Trace:
    """One microbatch's forward + backward on one chunk (see the module doc)."""

    gemms: list[tuple[int, int, int, int, str]] = field(default_factory=list)
    attention: list[tuple] = field(default_factory=list)
    collectives: list[tuple[str, int, int, str]] = field(default_factory=list)
    other_bytes: int = 0
    other_ops: int = 0

    @property
    def gemm_flops(self) -> float:
        return sum(2.0 * m * n * k * b for m, n, k, b, _ in self.gemms)

    @property
    def attention_flops(self) -> float:
        """4·b·heads·s_q·s_kv·d forward (QKᵀ and PV), twice that backward; halved when causal."""
        total = 0.0
        for b, h, sq, skv, d, causal, kind in self.attention:
            f = 4.0 * b * h * sq * skv * d * (2 if kind == "backward" else 1)
            total += f / 2 if causal else f
        return total


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _group_name(group) -> str:
    for name, getter in (
        ("tp", ps.get_tensor_model_parallel_group),
        ("cp", ps.get_context_parallel_group),
        ("dp", ps.get_data_parallel_group),
        ("pp", ps.get_pipeline_model_parallel_group),
        ("ep", ps.get_expert_model_parallel_group),
        ("expert_tp", ps.get_expert_tensor_parallel_group),
        ("expert_tp_ep", ps.get_expert_tensor_and_model_parallel_group),
        ("embedding", ps.get_embedding_group),
    ):
        try:
            if getter() is group:
                return name
        except (AssertionError, RuntimeError):
            continue
    return "other"


class _Attention(torch.autograd.Function):
    """SDPA by shape only: records the forward and backward calls."""

    @staticmethod
    def forward(ctx, trace, q, k, v, causal):  # q [b, np, sq, hn], k/v [b, ng, skv, hn]
        ctx.trace, ctx.shapes = trace, (q.shape, k.shape, v.shape)
        ctx.causal = causal
        b, h, sq, d = q.shape
        trace.attention.append((b, h, sq, k.shape[2], d, causal, "forward"))
        return q.new_empty(b, h, sq, v.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        (b, h, sq, d), ks, vs = ctx.shapes
        ctx.trace.attention.append((b, h, sq, ks[2], d, ctx.causal, "backward"))
        return None, grad.new_empty(b, h, sq, d), grad.new_empty(ks), grad.new_empty(vs), None


class _SdpaByShape(TorchFunctionMode):
    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            q, k, v = args[:3]
            return _Attention.apply(self.trace, q, k, v, bool(kwargs.get("is_causal", False)))
        return func(*args, **kwargs)


class OpTrace(TorchDispatchMode):
    """Records gemms, collectives and other kernels' bytes into `self.trace`."""

    def __init__(self) -> None:
        super().__init__()
        self.trace = Trace()
        self._inside_fused = False

    def fused(self, fn):
        """`fn` recorded as one fused kernel: its tensor inputs read and outputs written once."""

        def run(*args):
            self._inside_fused = True
            try:
                out = fn(*args)
            finally:
                self._inside_fused = False
            flat = tree_flatten((args, out))[0]
            self.trace.other_bytes += sum(_nbytes(t) for t in flat if isinstance(t, torch.Tensor))
            self.trace.other_ops += 1
            return out

        return run

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._inside_fused:
            return out
        name = str(func)
        if name in _GEMMS:
            a, b = (args[1], args[2]) if "addmm" in name or "baddbmm" in name else args[:2]
            batch = a.shape[0] if a.dim() == 3 else 1
            m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
            layout = "".join("t" if x.stride(-1) != 1 else "n" for x in (a, b))
            self.trace.gemms.append((m, n, k, batch, layout))
        elif name == "aten._grouped_mm.default":
            self.trace.gemms.append(_grouped_gemm(args[0], args[1], out))
        elif name.startswith("c10d."):
            self._collective(name, args)
        elif name.split(".")[1] not in _FREE:
            flat = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.trace.other_bytes += sum(_nbytes(t) for t in flat)
            self.trace.other_ops += 1
        return out

    def _collective(self, name: str, args) -> None:
        kind = name.split(".")[1].strip("_").removesuffix("_base")
        flat = tree_flatten(args)[0]
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        boxed = [x for x in flat if isinstance(x, torch.ScriptObject) and _is_group(x)]
        group = torch.distributed.ProcessGroup.unbox(boxed[0]) if boxed else None
        size = group.size() if group is not None else 1
        nbytes = max((_nbytes(t) for t in tensors), default=0)
        self.trace.collectives.append((kind, nbytes, size, _group_name(group)))


def _grouped_gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> tuple:
    """(m, n, k, groups, layout) of one `torch._grouped_mm`: 2-D x 3-D splits a's rows over the
    groups (forward, input gradient), 2-D x 2-D splits the contraction (a weight gradient per
    group), 3-D x 3-D is a batch; m is a group's mean share when rows are split."""
    layout = "".join("t" if x.stride(-1) != 1 else "n" for x in (a, b))
    if a.dim() == 2 and b.dim() == 3:
        groups = b.shape[0]
        return (a.shape[0] / groups, b.shape[2], a.shape[1], groups, layout)
    if a.dim() == 2 and b.dim() == 2:
        groups = out.shape[0]
        return (a.shape[0], b.shape[1], a.shape[1] / groups, groups, layout)
    return (a.shape[1], b.shape[2], a.shape[2], a.shape[0], layout)


def _is_group(obj: torch.ScriptObject) -> bool:
    return str(obj._type()).endswith("c10d.ProcessGroup")


@contextlib.contextmanager
def _compiled_ce_helpers(tracer: OpTrace):
    """The chunked cross entropy's elementwise helpers as CUDA runs them (torch.compile'd: one
    fused kernel each); on meta `compiled=None` picks the eager ones, swapped here for the trace."""
    from gigatron.core.fusions import chunked_cross_entropy as ce

    eager = ce._HELPERS["eager"]
    ce._HELPERS["eager"] = tuple(tracer.fused(f) for f in eager)
    try:
        yield
    finally:
        ce._HELPERS["eager"] = eager


def trace_chunk(args, chunk, *, first: bool, last: bool) -> Trace:
    """One microbatch forward + backward of `chunk` on meta (inside `world.fake_rank`)."""
    b, s = args.micro_batch_size, args.seq_length // args.context_parallel_size
    h = args.hidden_size
    s_in = s // args.tensor_model_parallel_size if args.sequence_parallel else s
    with torch.device("meta"):
        tokens = torch.zeros(b, s, dtype=torch.long)
        position_ids = torch.arange(s).expand(b, s)
        hidden = None if first else torch.zeros(s_in, b, h, dtype=chunk.config.params_dtype)
    if hidden is not None:
        hidden.requires_grad_(True)
        chunk.set_input_tensor(hidden)
    tracer = OpTrace()
    routing, grouped = contextlib.nullcontext(), contextlib.nullcontext()
    if args.num_experts:  # routed MoE layers: each expert gets its even share (moe_trace.py)
        routing, grouped = (
            BalancedRouting(args.moe_router_topk / args.num_experts),
            cuda_grouped_gemm(),
        )
    # meta as the default device too: what the forward creates (masks, rotary tables) stays meta
    with (
        torch.device("meta"),
        _SdpaByShape(tracer.trace),
        tracer,
        routing,
        grouped,
        _compiled_ce_helpers(tracer),
    ):
        out = chunk(tokens, position_ids, None, labels=tokens if last else None)
        grad = torch.ones_like(out)
        out.backward(grad)
    return tracer.trace

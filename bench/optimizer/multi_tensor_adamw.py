"""AdamW whose CUDA step is one Triton kernel over all tensors (gigatron-only, experimental).

`torch.optim.AdamW(fused=True)` steps gpt-1.3b's 1.32 B bf16 params in 6.91 ms on an H200
(2.67 TB/s); one compiled pass over the same bytes as a flat tensor takes 4.34 ms
(`bench/optimizer/bench_adamw.py`, bench/reports/optimizer-step.md). `MultiTensorAdamW` gets a flat
pass's memory access without flat storage: a block table built once from the tensor sizes
(`_triton_adamw.py`) lets one launch per (param dtype, grad dtype) walk every tensor in large
vectorised blocks, reading each tensor's address from small per-step address arrays, so the
grads may be the fresh tensors autograd makes every step. A drop-in `torch.optim.Optimizer`:
param groups (each with its own lr / weight decay, LR schedulers work), torch AdamW's state keys
(`step`, `exp_avg`, `exp_avg_sq`: state dicts load into either), moments in the params' dtype,
math in fp32 with torch AdamW's formula (host float64 bias corrections). Without CUDA or Triton
the same update runs per tensor in PyTorch. Not supported (ValueError): amsgrad, maximize.
Tensors the kernel cannot take (non-contiguous, or moments of another dtype, size or device) get
the PyTorch update, in their own shapes and strides. Steps may run on different CUDA streams: the
cached address arrays are copied anew on a stream other than the one that copied them, and a
block table read on another stream is recorded on it for the caching allocator.

    opt = MultiTensorAdamW(model.parameters(), lr=1e-4)   # then as torch.optim.AdamW
"""

from __future__ import annotations

import contextlib
import math

import torch

from bench.optimizer.flat_adamw import adamw_flat_update, check_adamw_hyperparameters

_FILE = "bench/optimizer/multi_tensor_adamw.py"
_MAX_TABLES = 8  # block tables kept (most recently used): grads of other subsets of the params


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _current_stream(device: torch.device):
    """The CUDA stream now current on `device`, where the launch goes (None off CUDA)."""
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def _keep_alive_on(tensors, stream) -> None:
    """Tell the caching allocator that `stream` reads `tensors` (allocated on another stream):
    their memory is not handed out again, once freed, before that stream's queued work ran."""
    if stream is not None:
        for t in tensors:
            t.record_stream(stream)


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on `device` without a host sync (pinned, non-blocking on CUDA)."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


class MultiTensorAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update, one Triton launch per dtype pair on CUDA (module docstring).

    `block`: elements per Triton program (a power of two). `use_triton=None`: on CUDA when
    Triton imports; True forces it (CPU tensors under `TRITON_INTERPRET=1`, for tests).
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        amsgrad: bool = False,
        maximize: bool = False,
        block: int = 4096,
        use_triton: bool | None = None,
    ):
        check_adamw_hyperparameters("MultiTensorAdamW", lr, betas, eps, weight_decay, _FILE)
        if amsgrad or maximize:
            raise ValueError(
                f"MultiTensorAdamW: amsgrad ({amsgrad}) and maximize ({maximize}) are not "
                f"supported; use torch.optim.AdamW ({_FILE})"
            )
        if block < 128 or block & (block - 1):
            raise ValueError(f"MultiTensorAdamW block ({block}) must be a power of two >= 128")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.block, self.use_triton = block, use_triton
        # sizes key -> (block table, the stream it was allocated on)
        self._tables: dict[tuple, tuple] = {}
        # batch key -> (addresses, their device arrays, all 16-byte aligned, the stream that
        # copied them)
        self._addresses: dict[tuple, tuple] = {}

    def load_state_dict(self, state_dict) -> None:
        """torch's load, then every `step` a CPU float32 tensor: torch puts it on the param's
        device when the saved groups say fused / capturable (a fused AdamW's state dict), and
        `step` reads it on the host per tensor (a device sync each if left on the GPU). A state
        dict whose groups ask for amsgrad or maximize (a torch AdamW's) is refused: this
        optimizer would silently step without them."""
        for i, group in enumerate(state_dict.get("param_groups", [])):
            for key in ("amsgrad", "maximize"):
                if group.get(key):
                    raise ValueError(
                        f"MultiTensorAdamW.load_state_dict: param group {i} has {key}=True, "
                        f"which MultiTensorAdamW does not support ({_FILE})"
                    )
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "step" in state:
                state["step"] = torch.as_tensor(state["step"]).to("cpu", torch.float32)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # (beta1, beta2, eps, dtype pair, device) -> [(param, grad, state, decay, step size, b2)]
        # The host work is per group, not per tensor, where it can be (a step of gpt-1.3b's 292
        # tensors is otherwise ~2 ms of Python, more than its kernel).
        batches: dict[tuple, list] = {}
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            states = []
            for p in params:
                if p.grad.is_sparse:
                    raise ValueError(f"MultiTensorAdamW: sparse gradients ({_FILE})")
                state = self.state[p]
                if not state:
                    # float32 whatever the default dtype (torch AdamW's; a bf16 count stops at 256)
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                states.append(state)
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1.0)
            scalars: dict[float, tuple] = {}  # step -> (1 - lr wd, lr / (1 - b1^t), sqrt(1 - b2^t))
            for p, state, t in zip(params, states, torch.stack(steps).tolist(), strict=True):
                sc = scalars.get(t)
                if sc is None:
                    sc = (1.0 - lr * wd, lr / (1.0 - beta1**t), math.sqrt(1.0 - beta2**t))
                    scalars[t] = sc
                key = (beta1, beta2, eps, p.dtype, p.grad.dtype, p.device)
                batches.setdefault(key, []).append((p, p.grad, state, *sc))
        for key, entries in batches.items():
            beta1, beta2, eps = key[:3]
            ok = [self._triton_ok(e) for e in entries]
            fast = [e for e, o in zip(entries, ok, strict=True) if o]
            if fast:
                self._triton_step(key, fast, (beta1, beta2, eps))
            for p, g, state, *scalars in (e for e, o in zip(entries, ok, strict=True) if not o):
                s = torch.tensor(scalars, dtype=torch.float32, device=p.device)
                # elementwise in the tensors' own shapes: any strides (no view(-1))
                m, v = state["exp_avg"], state["exp_avg_sq"]
                adamw_flat_update(p, g, m, v, s, beta1, beta2, eps)
        # address arrays only for this step's batches: a momentum schedule (OneCycleLR's
        # cycle_momentum) changes beta1, so the batch key, every step
        for key in self._addresses.keys() - batches.keys():
            del self._addresses[key]
        return loss

    def _triton_ok(self, entry) -> bool:
        p, g, state = entry[0], entry[1], entry[2]
        use = self.use_triton
        if use is None:
            use = p.is_cuda and _triton_available()
        if not use:
            return False
        m, v = state["exp_avg"], state["exp_avg_sq"]
        # the kernel reads raw addresses: moments in the param's dtype, sizes and device, or
        # the PyTorch update (which casts, or raises on a mismatch instead of corrupting memory)
        dt, dev, n = p.dtype, p.device, p.numel()
        return (
            m.dtype == dt
            and v.dtype == dt
            and m.device == dev
            and v.device == dev
            and g.device == dev
            and n == g.numel() == m.numel() == v.numel()
            and p.is_contiguous()
            and g.is_contiguous()
            and m.is_contiguous()
            and v.is_contiguous()
        )

    def _triton_step(self, batch_key, entries, betas_eps) -> None:
        from bench.optimizer import _triton_adamw

        device = entries[0][0].device
        stream = _current_stream(device)
        tables = self._block_table(tuple(e[0] for e in entries), device, stream)
        cols = list(zip(*entries, strict=True))  # params, grads, states, decay, step, b2
        addrs = tuple(t.data_ptr() for t in cols[0]) + tuple(t.data_ptr() for t in cols[1])
        addrs += tuple(s["exp_avg"].data_ptr() for s in cols[2])
        addrs += tuple(s["exp_avg_sq"].data_ptr() for s in cols[2])
        # the address arrays on the device, reused while nothing moved (autograd's caching
        # allocator mostly hands the grads the same blocks every step): no copy, no pinning.
        # Only on the stream that copied them: their non-blocking copy is ordered on that
        # stream alone, and their memory returns to that stream's pool when dropped (another
        # stream's kernel could read it before the copy lands, or after it is handed out
        # again). A step on another stream copies them anew there.
        cached = self._addresses.get(batch_key)
        if cached is None or cached[0] != addrs or cached[3] != stream:
            aligned = all(a % 16 == 0 for a in addrs)
            host = _to_device(torch.tensor(addrs, dtype=torch.int64).view(4, -1), device)
            cached = self._addresses[batch_key] = (addrs, tuple(host), aligned, stream)
        scal = torch.tensor([cols[3], cols[4], cols[5]], dtype=torch.float64).float()  # [3, T]
        scal = _to_device(scal, device)
        dtypes = (cols[0][0].dtype, cols[1][0].dtype)
        # Triton launches on the current device: make it the params' one
        guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with guard:
            _triton_adamw.launch(
                tables, cached[1], tuple(scal), betas_eps, *dtypes, self.block, cached[2]
            )

    def _block_table(self, params: tuple, device, stream) -> tuple:
        """(block -> tensor index int32 [B], block -> first element int64 [B], numel [T]),
        built once per list of tensor sizes (the table depends on nothing else: keyed by the
        sizes, not by id(p), it cannot go stale when a param is replaced or resized or an id is
        reused); the `_MAX_TABLES` most recently used lists are kept. `stream`: where the
        kernel reading it runs (None off CUDA)."""
        numels = tuple(p.numel() for p in params)
        key = (device, self.block, numels)
        entry = self._tables.pop(key, None)
        if entry is None:
            blocks = [(i, o) for i, n in enumerate(numels) for o in range(0, n, self.block)]
            block_tensor = torch.tensor([b[0] for b in blocks], dtype=torch.int32)
            block_offset = torch.tensor([b[1] for b in blocks], dtype=torch.int64)
            numel = torch.tensor(numels, dtype=torch.int64)
            # a blocking copy (pageable host memory): done before any stream reads the table
            entry = (tuple(t.to(device) for t in (block_tensor, block_offset, numel)), stream)
        elif entry[1] != stream:
            # read on a stream other than the one it was allocated on: once evicted, its
            # memory must wait for this stream's kernel (rebuilding instead: ~0.15 s of host work
            # for gpt-1.3b's tables)
            _keep_alive_on(entry[0], stream)
        self._tables[key] = entry  # the most recently used last
        while len(self._tables) > _MAX_TABLES:  # e.g. MoE experts without tokens: grad None
            del self._tables[next(iter(self._tables))]
        return entry[0]

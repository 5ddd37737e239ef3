"""AdamW over DDP's flat gradient buffers (gigatron-only, experimental; no Megatron counterpart).

Megatron's DDP keeps each (param dtype, grad dtype) group's grads in one flat buffer
(`param.main_grad` are views of it). `FlatAdamW` moves the params into flat buffers laid out the
same way (`param.data` becomes a view, values kept), so one optimizer step is one elementwise pass
over four flat tensors per buffer (param, grad, exp_avg, exp_avg_sq) instead of a multi-tensor
kernel over hundreds of tensors. On CUDA the pass is a torch.compile'd (Inductor/Triton) kernel:
gpt-1.3b's 1.32 B bf16 params step in 4.34 ms against 6.91 ms for `torch.optim.AdamW(fused=True)`
over the per-parameter tensors (H200, `bench/optimizer/bench_adamw.py`,
bench/reports/optimizer-step.md).

Numerics are torch.optim.AdamW's (decoupled weight decay, bias-corrected moments, eps outside
the square root) with the moments stored in the params' dtype and the math in fp32 registers, as
`AdamW(fused=True)` does for these params. One param group: every param gets the same lr and
weight decay (the benchmark's optimizer; `get_megatron_optimizer` remains the training one).

    ddp = DistributedDataParallel(config, DistributedDataParallelConfig(), model)
    opt = FlatAdamW(ddp, lr=1e-4)
    ddp.zero_grad_buffer(); loss.backward(); ddp.finish_grad_sync(); opt.step()
"""

from __future__ import annotations

import math

import torch

_FILE = "bench/optimizer/flat_adamw.py"


def adamw_flat_update(param, grad, exp_avg, exp_avg_sq, scalars, beta1, beta2, eps):
    """One AdamW update in place. param/exp_avg/exp_avg_sq [n] (one dtype), grad [n] (any float
    dtype); scalars fp32 [3] = (1 - lr * weight_decay, lr / (1 - beta1^t), sqrt(1 - beta2^t)),
    computed in float64 on the host as torch.optim.AdamW does (a tensor: no recompile as the
    step or lr change); beta1, beta2, eps floats."""
    g = grad.float()
    m = exp_avg.float().lerp(g, 1.0 - beta1)
    v = exp_avg_sq.float() * beta2 + (1.0 - beta2) * g * g
    decay, step_size, bias2_sqrt = scalars[0], scalars[1], scalars[2]
    p = param.float() * decay - step_size * m / (v.sqrt() / bias2_sqrt + eps)
    param.copy_(p)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def check_adamw_hyperparameters(owner: str, lr, betas, eps, weight_decay, file: str) -> None:
    """ValueError naming the value and the rule: lr, eps, weight_decay >= 0, betas in [0, 1)."""
    for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if value < 0:
            raise ValueError(f"{owner} {name} ({value}) must be >= 0 ({file})")
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{owner} betas {betas} must lie in [0, 1) ({file})")


_UPDATE = {"eager": adamw_flat_update}


def _update_fn(compiled: bool):
    key = "compiled" if compiled else "eager"
    if key not in _UPDATE:
        _UPDATE[key] = torch.compile(adamw_flat_update, dynamic=False)
    return _UPDATE[key]


class FlatAdamW:
    """AdamW stepping each DDP grad buffer as one flat tensor (see the module docstring).

    ddp_model: gigatron `DistributedDataParallel` without the distributed optimizer (the grads
    of every param in its buffers are final after `finish_grad_sync`). `compiled=None` compiles
    the update on CUDA.

    Build it before anything keeps the params' old storage: before CUDA graphs capture the model
    (torch.compile of the model is fine, its graphs read the params as inputs), and once per DDP
    model (a second FlatAdamW moves the params again; the first one then steps stale copies).
    Load weights in place afterwards (`model.load_state_dict`, not `assign=True`). The lr is
    `self.lr` (no `param_groups`: torch / Megatron LR schedulers cannot drive it; set `lr`).
    """

    def __init__(
        self,
        ddp_model,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        compiled: bool | None = None,
    ):
        if ddp_model.ddp_config.use_distributed_optimizer:
            raise ValueError(
                "FlatAdamW needs DDP without use_distributed_optimizer (True): each rank steps "
                f"whole buffers ({_FILE})"
            )
        check_adamw_hyperparameters("FlatAdamW", lr, betas, eps, weight_decay, _FILE)
        self.beta1, self.beta2 = (float(b) for b in betas)
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.ddp = ddp_model
        self.buffers = list(ddp_model.buffers) + list(ddp_model.expert_parallel_buffers)
        if not self.buffers:
            raise ValueError(f"FlatAdamW: the DDP model has no trainable params ({_FILE})")
        device = self.buffers[0].grad_data.device
        self.step_count = 0
        self.lr = float(lr)
        self._scalars = torch.zeros(3, dtype=torch.float32, device=device)
        self.params = [p for buffer in self.buffers for p in buffer.params]
        # Per buffer: (flat params [n], flat grads [n] = buffer.grad_data, exp_avg, exp_avg_sq)
        self.flat: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for buffer in self.buffers:
                flat = torch.zeros(buffer.numel, dtype=buffer.param_dtype, device=device)
                for param in buffer.params:
                    start, end, _ = buffer.param_index_map[param]
                    view = flat[start:end].view(param.shape)
                    view.copy_(param.data)
                    param.data = view
                state = (torch.zeros_like(flat), torch.zeros_like(flat))
                self.flat.append((flat, buffer.grad_data, *state))
        self.compiled = device.type == "cuda" if compiled is None else compiled

    def _next_step(self):
        """Advance the step count, set the device scalars; return the update function."""
        self.step_count += 1
        t = self.step_count
        host = (
            1.0 - self.lr * self.weight_decay,
            self.lr / (1.0 - self.beta1**t),
            math.sqrt(1.0 - self.beta2**t),
        )
        for i, value in enumerate(host):
            self._scalars[i].fill_(value)  # a kernel argument each: no host-device sync
        return _update_fn(self.compiled)

    def _update(self, update, lo_hi) -> None:
        """Update elements [lo, hi) of each buffer (lo_hi: one (lo, hi) per buffer)."""
        for (flat, grad, m, v), (lo, hi) in zip(self.flat, lo_hi, strict=True):
            if hi > lo:
                args = (flat[lo:hi], grad[lo:hi], m[lo:hi], v[lo:hi], self._scalars)
                update(*args, self.beta1, self.beta2, self.eps)

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW update of every param from the (reduced) grad buffers (`self.lr` may be
        changed between steps)."""
        update = self._next_step()
        self._update(update, [(0, flat.numel()) for flat, _, _, _ in self.flat])

    @torch.no_grad()
    def finish_grad_sync_and_step(self) -> None:
        """`ddp.finish_grad_sync(); step()` with the update of all but each buffer's last bucket
        queued before waiting for the last buckets' collectives.

        The last bucket of a buffer (highest offset: the first-registered params, e.g. the word
        embedding, whose grad is complete only at the end of backward) is reduced last; its
        collective then runs beside the update of the other buckets instead of before it. Same
        result as the two calls (each element sees the same update)."""
        last = {id(max(buffer.buckets, key=lambda b: b.offset)) for buffer in self.buffers}
        groups = self.ddp._all_bucket_groups()
        late = [g for g in groups if any(id(b) in last for b in g.buckets)]
        # per buffer: where its late buckets start (a group may hold several buckets)
        late_ids = {id(b) for g in late for b in g.buckets}
        split = [
            min(b.offset for b in buffer.buckets if id(b) in late_ids) for buffer in self.buffers
        ]
        for group in groups:
            if all(group is not g for g in late):
                group.finish_grad_sync()
        update = self._next_step()
        self._update(update, [(0, k) for k in split])
        for group in late:
            group.finish_grad_sync()
        self._update(update, [(k, flat.numel()) for k, (flat, _, _, _) in zip(split, self.flat)])

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop any `.grad` (DDP's zero_grad_buffer zeroes the grads this optimizer reads)."""
        for param in self.params:
            param.grad = None

    def state_dict(self) -> dict:
        return {
            "step": self.step_count,
            "lr": self.lr,
            "exp_avg": [s[2].clone() for s in self.flat],
            "exp_avg_sq": [s[3].clone() for s in self.flat],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if len(state_dict["exp_avg"]) != len(self.flat):
            raise ValueError(
                f"FlatAdamW state for {len(state_dict['exp_avg'])} buffers, this model has "
                f"{len(self.flat)} ({_FILE})"
            )
        self.step_count = int(state_dict["step"])
        self.lr = state_dict["lr"]
        for (_, _, m, v), m_saved, v_saved in zip(
            self.flat, state_dict["exp_avg"], state_dict["exp_avg_sq"], strict=True
        ):
            m.copy_(m_saved)
            v.copy_(v_saved)

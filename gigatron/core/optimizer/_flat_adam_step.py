"""A flat fused Adam / AdamW step for `DistributedOptimizer` (gigatron-only). Used by default when
every main param is on a GPU and the optimizer qualifies (Adam / AdamW, fp32 grad buffers, no
loss scaler: `flat_step_wanted`); `OptimizerConfig.flat_adam_step=False` (`--no-flat-adam-step`)
turns it off, True (`--flat-adam-step`) forces it (any device; an optimizer that does not qualify
is then an error).

Under the distributed optimizer each bucket's shard of this rank, [s0, s1) in DDP's flat
buffers, is contiguous in the grad buffer (fp32: the reduce-scatter's result) and in the param
buffer (the model dtype). This step keeps the fp32 main params and Adam's exp_avg / exp_avg_sq
of each shard as flat fp32 tensors laid out like the buffer (padding included); the torch
optimizer's params and state are views of them, so state dicts and checkpoints are unchanged.
One compiled elementwise pass per shard reads main, grad, exp_avg, exp_avg_sq and a per-element
param-group index, and writes main, exp_avg, exp_avg_sq and the model-dtype param: the torch
fused Adam step and the main -> model copy in one pass (torch's formula; fp32 results equal up
to rounding order). Padding elements belong to an extra group whose step leaves them as they
are. The norm is taken before, as without it (on the grad buffer's views); clipping is folded
into the pass (the grad times the clipping coefficient, the product clipping would store), so
the grad buffer keeps the unclipped grads after the step.

Step hooks: the torch optimizer's step pre / post hooks (its own and the global ones) run around
the flat step as around `opt.step()`, through torch's wrapper. Two differences: the model params
are written in the same pass, so post hooks see them updated (the torch path copies main ->
model after its post hooks); and the grads they see are not clipped (clipping is folded into
the pass; `grad_scale` holds the coefficient the pass will apply).

Needs: torch.optim.Adam / AdamW without amsgrad / maximize, fp32 grad buffers
(`grad_reduce_in_fp32=True`), no loss scaler (bf16 or fp32 models).
"""

from __future__ import annotations

import contextlib

import torch

_FILE = "gigatron/core/optimizer/_flat_adam_step.py"
# table columns: decay, step_size, bias2_sqrt, 1 - beta1, beta2, 1 - beta2, eps, l2 (Adam's
# coupled weight decay), grad scale (the clipping coefficient); 1 - beta in float64 on the host
# as torch does (1 - fp32(0.999) is off by 1.3e-5)


def flat_adam_update(
    main, grad, exp_avg, exp_avg_sq, gid, table, model, device_scale=None, skip=None
) -> None:
    """One Adam(W) update in place, in torch.optim.AdamW's order of operations. main / exp_avg /
    exp_avg_sq fp32 [n], grad fp32 [n], gid uint8 [n] (row of `table` for each element), table
    fp32 [G, 9] (columns above), model [n] in the model dtype or None (fp32 models: main is the
    param buffer). The grad is multiplied by the scale first, as clipping scales it in place.
    The sync-free step passes the clipping coefficient as a 0-dim fp32 tensor `device_scale`
    (the table's scale column is then 1) and `skip`, a 0-dim bool tensor: when true every
    element keeps its value (a NaN/Inf norm skips the step without the host reading it)."""
    idx = gid.long()
    decay, step_size, bias2_sqrt = table[:, 0][idx], table[:, 1][idx], table[:, 2][idx]
    one_minus_beta1, beta2, one_minus_beta2 = table[:, 3][idx], table[:, 4][idx], table[:, 5][idx]
    eps, l2, scale = table[:, 6][idx], table[:, 7][idx], table[:, 8][idx]
    if device_scale is not None:
        scale = scale * device_scale
    g = grad * scale + l2 * main
    m = exp_avg.lerp(g, one_minus_beta1)
    v = exp_avg_sq * beta2 + one_minus_beta2 * (g * g)
    p = main * decay - step_size * (m / (v.sqrt() / bias2_sqrt + eps))
    if skip is not None:
        m, v, p = (
            torch.where(skip, old, new) for old, new in ((exp_avg, m), (exp_avg_sq, v), (main, p))
        )
    main.copy_(p)
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)
    if model is not None:
        model.copy_(p)


_COMPILED = {}


def _update_fn(device: torch.device):
    if device.type != "cuda":  # CPU (tests, gloo): eager
        return flat_adam_update
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = _compiled_or_eager(torch.compile(flat_adam_update, dynamic=True))
    return _COMPILED["fn"]


def _duck_shapes_off():
    """A context with duck shaping off, for the calls of the compiled pass (while one traces):
    a shard's grad / param views sit at storage offsets that can equal another tensor's length
    (DP rank 1's first shard starts at the shard length), and the equality guard duck shaping
    adds recompiled the pass for every shard until dynamo's recompile limit (DP = 2 on CUDA).
    Entered once per step around all shards (~10-25 us)."""
    from torch.fx.experimental import _config as fx_config

    return fx_config.patch(use_duck_shape=False)


def _compiled_or_eager(compiled):
    """`compiled`, or the eager update (with a warning) if its first call fails to compile
    (no Triton / C compiler): the inputs are untouched until the compiled kernel runs."""

    def update(*args):
        if _COMPILED.get("eager"):
            return flat_adam_update(*args)
        if _COMPILED.get("ok"):
            return compiled(*args)
        try:  # the first call compiles
            out = compiled(*args)
        except Exception as err:  # torch._dynamo / Inductor compile errors have no common base
            import warnings

            warnings.warn(
                f"flat Adam step: torch.compile failed ({type(err).__name__}: {err}); using the "
                f"eager update (slower). OptimizerConfig.flat_adam_step=False selects torch's "
                f"fused Adam instead ({_FILE})",
                stacklevel=2,
            )
            _COMPILED["eager"] = True
            return flat_adam_update(*args)
        _COMPILED["ok"] = True
        return out

    return update


def _all_on_gpu(dist_opt) -> bool:
    params = [p for g in dist_opt.optimizer.param_groups for p in g["params"]]
    return bool(params) and all(p.is_cuda for p in params)


def flat_step_wanted(dist_opt) -> bool:
    """Whether `dist_opt` steps through FlatAdamStep: `config.flat_adam_step` True yes (its
    errors raise when building), False no, None: when its params are on CUDA and it qualifies."""
    mode = dist_opt.config.flat_adam_step
    if mode is not None:
        return bool(mode)
    if not _all_on_gpu(dist_opt):
        return False
    try:
        _check(dist_opt)
    except ValueError:
        return False
    return True


class _Segment:
    """This rank's shard of one bucket: flat views and tensors, and where each main lives."""

    def __init__(self, grad, param, n):
        self.grad = grad  # [n] fp32 view of the grad buffer
        fp32 = param.dtype == torch.float32
        self.model = None if fp32 else param  # [n] model-dtype view of the param buffer
        self.main = param if fp32 else torch.zeros(n, dtype=torch.float32, device=grad.device)
        self.exp_avg = torch.zeros(n, dtype=torch.float32, device=grad.device)
        self.exp_avg_sq = torch.zeros_like(self.exp_avg)
        self.gid = torch.empty(n, dtype=torch.uint8, device=grad.device)
        # [a, b) ranges of params in the shard that no main param covers (in a buffer but not
        # in the optimizer, e.g. frozen after DDP wrapped the model): the step writes main
        # into the model param there, so main must hold the model's values (bf16 -> fp32 is
        # exact)
        self.keep: list[tuple[int, int]] = []


class FlatAdamStep:
    """Builds the flat storage for a DistributedOptimizer and steps it (see module docstring)."""

    def __init__(self, dist_opt):
        opt = dist_opt.optimizer
        self.opt = opt
        _check(dist_opt)
        groups = opt.param_groups
        group_of = {id(p): i for i, g in enumerate(groups) for p in g["params"]}
        self.padding_row = len(groups)
        self.grad_scale = 1.0  # the clipping coefficient of the coming step (then back to 1)
        # the sync-free step's (coefficient, skip flag), 0-dim device tensors, for one step
        self.device_clip: tuple[torch.Tensor, torch.Tensor] | None = None
        self.segments: list[_Segment] = []
        self.views: list[tuple] = []  # (main param, segment, a, b)
        where = {}
        for param, main, lo, hi in dist_opt._entries():
            where[param] = (main, lo, hi)
        for buffer, bucket, s0, s1 in dist_opt.bucket_shards():
            shard = s1 - s0
            seg = _Segment(buffer.grad_data[s0:s1], buffer.param_data[s0:s1], shard)
            seg.gid.fill_(self.padding_row)
            for param in bucket.params_list:
                if param not in where:
                    p0, p1, _ = buffer.param_index_map[param]
                    a, b = max(p0, s0) - s0, min(p1, s1) - s0
                    if a < b and seg.model is not None:
                        seg.keep.append((a, b))
                    continue
                main, lo, hi = where[param]
                a = buffer.param_index_map[param][0] + lo - s0
                seg.gid[a : a + hi - lo] = group_of[id(main)]
                self.views.append((main, seg, a, a + hi - lo))
            self.segments.append(seg)
        self.resync()

    def _in_place(self) -> bool:
        """True when every main param and Adam state tensor is still the one resync() left
        (identity and storage checks only: the per-step fast path of resync)."""
        state = self.opt.state
        for main, m, v, ptr in self._synced:
            st = state.get(main)
            if (
                st is None
                or st.get("exp_avg") is not m
                or st.get("exp_avg_sq") is not v
                or main.data_ptr() != ptr
                or st["step"].device.type != "cpu"
            ):
                return False
        return True

    def resync(self) -> None:
        """Point every main param and its Adam state at the flat storage, copying the values
        they hold now (after building, or after a load or a hook replaced the tensors). A step
        finding everything in place costs identity checks only."""
        if getattr(self, "_synced", None) is not None and self._in_place():
            return
        self._synced = []
        with torch.no_grad():
            for main, seg, a, b in self.views:
                flat = seg.main[a:b]
                if main.data_ptr() != flat.data_ptr():
                    flat.copy_(main.detach().view(-1))
                    main.data = flat.view(main.shape)
                state = self.opt.state[main]
                step = state.get("step")
                if step is None:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                elif step.device.type != "cpu" or step.dtype != torch.float32:
                    # a fused optimizer's state dict keeps it on the GPU: read on the host here
                    state["step"] = step.detach().to("cpu", torch.float32)
                for key, store in (("exp_avg", seg.exp_avg), ("exp_avg_sq", seg.exp_avg_sq)):
                    view = store[a:b]
                    old = state.get(key)
                    if old is None or old.data_ptr() != view.data_ptr():
                        view.copy_(0.0 if old is None else old.detach().reshape(-1))
                        state[key] = view.view(main.shape)
                self._synced.append((main, state["exp_avg"], state["exp_avg_sq"], flat.data_ptr()))

    def _table(self, device) -> torch.Tensor:
        """[G + 1, 9] fp32: each group's scalars for this step (its steps advanced by one) and
        the padding row (leaves its elements unchanged)."""
        rows = []
        for group in self.opt.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            steps = [self.opt.state[p]["step"] for p in group["params"]]
            if steps:
                torch._foreach_add_(steps, 1.0)
            t = float(steps[0]) if steps else 1.0
            decoupled = group.get("decoupled_weight_decay", isinstance(self.opt, torch.optim.AdamW))
            decay, l2 = (1.0 - lr * wd, 0.0) if decoupled else (1.0, wd)
            bias1, bias2_sqrt = 1.0 - beta1**t, (1.0 - beta2**t) ** 0.5
            rows.append(
                [decay, lr / bias1, bias2_sqrt, 1.0 - beta1, beta2, 1.0 - beta2, eps, l2]
                + [self.grad_scale]
            )
        # padding (and params no main covers): weights 0, so m, v and p keep their values
        # (m = lerp(m, g, 0), v = v * 1 + 0 * g^2, p = p * 1 - 0 * ...) for finite grads
        rows.append([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
        table = torch.tensor(rows, dtype=torch.float64).float()
        if device.type == "cuda":
            return table.pin_memory().to(device, non_blocking=True)
        return table

    def step(self):
        """The Adam(W) step of every shard, model params included (grads already clipped),
        between the torch optimizer's step hooks as `self.opt.step()` runs them: torch's own
        wrapper calls the global then the optimizer's pre hooks with (opt, (opt,), {}) (one may
        return new (args, kwargs), e.g. a closure), the same profiler range, then the post
        hooks with the final arguments. Returns the closure's loss, as Adam.step does."""
        return torch.optim.Optimizer.profile_hook_step(self._hooked_step)(self.opt)

    def _hooked_step(self, opt, closure=None):
        """Adam.step's arguments after its `self` (`opt`): what the pre hooks hand over."""
        loss = None
        if closure is not None:
            with torch.enable_grad():  # as Adam.step calls it
                loss = closure()
        self._update()
        return loss

    @torch.no_grad()
    def _update(self) -> None:
        # after the pre hooks: they may change lr or replace params / state (resync sees it)
        self.resync()  # cheap when nothing moved (data_ptr checks)
        if not self.segments:
            return
        device = self.segments[0].grad.device
        table = self._table(device)
        self.grad_scale = 1.0  # used once: a later step without clipping must not reuse it
        clip, self.device_clip = self.device_clip or (None, None), None
        update = _update_fn(device)
        with _duck_shapes_off() if device.type == "cuda" else contextlib.nullcontext():
            for seg in self.segments:
                for a, b in seg.keep:  # their model values (a load may have changed them)
                    seg.main[a:b].copy_(seg.model[a:b])
                args = (seg.main, seg.grad, seg.exp_avg, seg.exp_avg_sq, seg.gid, table)
                update(*args, seg.model, *clip)


def _check(dist_opt) -> None:
    """ValueError naming the rule when the flat step cannot stand in for the torch step."""
    opt = dist_opt.optimizer
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        raise ValueError(
            f"flat_adam_step=True needs torch.optim.Adam or AdamW (got "
            f"{type(opt).__name__}) ({_FILE})"
        )
    if len(opt.param_groups) >= 255:  # uint8 group ids, one row kept for the padding
        raise ValueError(
            f"flat_adam_step=True: {len(opt.param_groups)} param groups (at most 254) ({_FILE})"
        )
    for group in opt.param_groups:
        if group.get("amsgrad") or group.get("maximize"):
            raise ValueError(f"flat_adam_step=True: amsgrad / maximize are not supported ({_FILE})")
    if dist_opt.grad_scaler is not None:
        raise ValueError(
            f"flat_adam_step=True needs no loss scaler (bf16 or fp32 models, not fp16) ({_FILE})"
        )
    for buffer in dist_opt.buffers:
        if buffer.grad_dtype != torch.float32:
            raise ValueError(
                f"flat_adam_step=True needs fp32 grad buffers (got {buffer.grad_dtype}"
                f"): set DistributedDataParallelConfig(grad_reduce_in_fp32=True) ({_FILE})"
            )

"""Megatron optimizer wrappers around a torch optimizer (`megatron.core.optimizer.optimizer`).

- `FP32Optimizer`: fp32 model. Points `param.grad` at DDP's `param.main_grad`, clips, steps.
- `Float16OptimizerWithFloat16Params`: bf16/fp16 model. The torch optimizer steps fp32 "main"
  copies of the low-precision params: copy grads to the main params (fp32), unscale and check
  for inf/NaN (fp16 loss scaling; the flag is max-reduced so every rank skips together), clip,
  step, copy main params back into the model params.
- `ChainedOptimizer`: several of the above (dense + expert params) behaving as one; the grad
  norm is taken over all of them together.

`step()` returns `(update_successful, grad_norm, num_zeros_in_grad)`; on overflow
`(False, None, None)` and neither weights nor optimizer state change. Two gigatron options:
- `step(check_grad_norm=True)` also skips the update when the global grad norm it computes for
  clipping is NaN/Inf, returning `(False, grad_norm, None)`: the training loop's NaN/Inf
  gradient check without a pass over the grads or a host sync of its own.
- `OptimizerConfig.sync_free_step`: that step with no host sync at all: the norm stays on the
  device, clipping and the skip of a NaN/Inf step happen inside torch's fused Adam(W) kernel
  (its `grad_scale` / `found_inf` inputs) or the flat Adam step's pass, and `update_successful`
  and `grad_norm` come back as 0-dim device tensors for the caller to read later.
`ChainedOptimizer` runs the same `step()`; its hooks combine the norms of its optimizers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from gigatron.core.optimizer._param_groups import (  # noqa: F401  (Megatron's names here)
    _param_group_override_keys,
    filter_and_reorder_param_groups,
    param_group_identifier_keys,
)
from gigatron.core.optimizer.clip_grads import (
    _is_not_tp_duplicate,
    clip_grad_by_total_norm_fp32,
    count_zeros_fp32,
    get_grad_norm_fp32,
    get_grad_norm_fp32_tensor,
    param_is_not_shared,
)

# expert_tp, is_qkv, qkv_split_shapes: Muon's tags (Megatron copies them to main params too)
_TP_ATTRS = (
    "tensor_model_parallel",
    "partition_dim",
    "partition_stride",
    "shared",
    "allreduce",
    "expert_tp",
    "is_qkv",
    "qkv_split_shapes",
)


def _copy_attrs(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy the attributes clipping and checkpointing read (TP split, tied, expert)."""
    for name in _TP_ATTRS:
        if hasattr(src, name):
            setattr(dst, name, getattr(src, name))


def _model_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """The accumulated grad of a model param: DDP's main_grad, else .grad."""
    return param.main_grad if getattr(param, "main_grad", None) is not None else param.grad


class MegatronOptimizer:
    """Base class: norm / clip / zero-count helpers and the shared `step()` recipe."""

    _filter_and_reorder_param_groups = staticmethod(filter_and_reorder_param_groups)

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        config,
        init_state_fn: Callable = lambda x: None,
    ):
        self.optimizer = optimizer
        self.config = config
        self.init_state_fn = init_state_fn
        self.grad_stats_parallel_group = None  # set by get_megatron_optimizer
        self.tp_group = None

    # ---- parameters and grads ------------------------------------------------------------
    def get_parameters(self) -> list[torch.nn.Parameter]:
        """The params the torch optimizer steps (main params for mixed precision)."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def get_main_grads_for_grad_norm(self) -> list[torch.Tensor]:
        """Grads counted in the norm: not a tied copy, not a TP replica on TP rank > 0."""
        return self._grads_for_norm()[0]

    def _grads_for_norm(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(grads counted in the norm, grads left out: tied copies and TP replicas on TP rank >
        0). Whether a param counts depends on its `shared` / `tensor_model_parallel` attributes
        and the TP group: decided once per param and attribute values, not each step (the TP
        check asks the process group for ranks)."""
        counts = self.__dict__.setdefault("_counts_in_norm", {})
        counted, left_out = [], []
        for p in self.get_parameters():
            if p.grad is None:
                continue
            attrs = (getattr(p, "shared", False), getattr(p, "tensor_model_parallel", False))
            hit = counts.get(id(p))
            if hit is None or hit[0] is not p or hit[1] != attrs:
                counted_p = param_is_not_shared(p) and _is_not_tp_duplicate(p, self.tp_group)
                hit = (p, attrs, counted_p)
                counts[id(p)] = hit
            (counted if hit[2] else left_out).append(p.grad)
        return counted, left_out

    def get_grad_stats_parallel_group(self):
        return self.grad_stats_parallel_group

    def get_grad_norm(self) -> float:
        return get_grad_norm_fp32(
            self.get_main_grads_for_grad_norm(),
            grad_stats_parallel_group=self.get_grad_stats_parallel_group(),
        )

    def _checked_grad_norm(self) -> float:
        """`get_grad_norm()`, NaN/Inf also when only a grad left out of the norm is (a TP
        replica's grad on TP rank > 0 is never reduced over TP without sequence parallelism, so
        a rank-local fault there would not reach the norm): they add 0 x their norm."""
        counted, left_out = self._grads_for_norm()
        return get_grad_norm_fp32(
            counted,
            grad_stats_parallel_group=self.get_grad_stats_parallel_group(),
            nonfinite_probe=left_out,
        )

    def clip_grad_norm(self, clip_grad: float) -> float:
        """Global L2 norm of the grads; scale them so it is at most `clip_grad`."""
        grad_norm = self.get_grad_norm()
        self._clip_grads_by_norm(clip_grad, grad_norm)
        return grad_norm

    def _clip_grads_by_norm(self, clip_grad: float, grad_norm: float) -> None:
        """Scale the grads by clip_grad / (grad_norm + 1e-6) when that is below 1."""
        clip_grad_by_total_norm_fp32(self.get_parameters(), clip_grad, grad_norm)

    def count_zeros(self) -> float:
        return count_zeros_fp32(
            self.get_parameters(),
            grad_stats_parallel_group=self.get_grad_stats_parallel_group(),
            tp_group=self.tp_group,
        )

    # ---- loss scale ----------------------------------------------------------------------
    def get_loss_scale(self) -> torch.Tensor:
        return torch.tensor([1.0])

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """Multiply the loss by the current loss scale (call before backward)."""
        return self.get_loss_scale().to(loss.device) * loss

    # ---- torch-optimizer passthrough -----------------------------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value):
        self.optimizer.param_groups = value

    @property
    def state(self):
        return self.optimizer.state

    # ---- the step ------------------------------------------------------------------------
    def prepare_grads(self) -> bool:
        """Put grads where the torch optimizer reads them; return True if inf/NaN found."""
        raise NotImplementedError

    def step_with_ready_grads(self) -> bool:
        raise NotImplementedError

    def state_dict(self):
        """The optimizer's state (each subclass's own layout; Megatron's abstract method)."""
        raise NotImplementedError

    def load_state_dict(self, state_dict) -> None:
        """Restore what `state_dict()` returned (Megatron's abstract method)."""
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        raise NotImplementedError

    def reload_model_params(self, state_dict=None) -> None:
        pass

    def _empty_norm(self):
        """The grad norm `step()` returns without clipping (none is computed)."""
        return 0.0

    @torch.no_grad()
    def step(self, *, check_grad_norm: bool = False):
        """prepare grads -> (skip on overflow) -> clip -> count zeros -> update. Returns
        `(update_successful, grad_norm, num_zeros_in_grad)` (module docstring).

        `check_grad_norm` (gigatron addition; needs clip_grad > 0): a NaN/Inf global grad norm
        skips the update (nothing changes) and returns `(False, grad_norm, None)`. With
        `config.sync_free_step` that check runs on the device (`_sync_free_step`)."""
        if self.config.sync_free_step:
            return self._sync_free_step()
        if check_grad_norm and not self.config.clip_grad > 0.0:
            raise ValueError(
                f"step(check_grad_norm=True) needs clip_grad > 0 (got {self.config.clip_grad}): "
                "without clipping no grad norm is computed"
            )
        if self.prepare_grads():
            return False, None, None
        grad_norm = self._empty_norm()
        if self.config.clip_grad > 0.0:
            grad_norm = self._checked_grad_norm() if check_grad_norm else self.get_grad_norm()
            if check_grad_norm and not math.isfinite(grad_norm):
                return False, grad_norm, None
            self._clip_grads_by_norm(self.config.clip_grad, grad_norm)
        num_zeros = self.count_zeros() if self.config.log_num_zeros_in_grad else self._zeros()
        return self.step_with_ready_grads(), grad_norm, num_zeros

    def _sync_free_step(self) -> tuple[torch.Tensor, torch.Tensor, None]:
        """`step(check_grad_norm=True)` without a host sync: `(update_successful, grad_norm,
        None)` with the first two 0-dim tensors on the grads' device; a NaN/Inf norm skips the
        update on the device (params and Adam moments unchanged; the step counts too, except
        under the flat Adam step, whose host-side counts advance). Needs clip_grad > 0, no loss
        scaler, torch's fused Adam / AdamW or the flat Adam step, no zero counting
        (`check_sync_free`)."""
        self.check_sync_free()
        self.prepare_grads()
        grad_norm = self._grad_norm_tensor()
        return ~self._step_on_device(grad_norm), grad_norm, None

    def check_sync_free(self) -> None:
        """ValueError naming the rule when the sync-free step cannot run."""
        rule = _sync_free_problem(self)
        if rule:
            raise ValueError(f"the sync-free step {rule}")

    def _grad_norm_tensor(self) -> torch.Tensor:
        counted, left_out = self._grads_for_norm()
        return get_grad_norm_fp32_tensor(
            counted,
            grad_stats_parallel_group=self.get_grad_stats_parallel_group(),
            nonfinite_probe=left_out,
        )

    def _step_on_device(self, grad_norm: torch.Tensor) -> torch.Tensor:
        """The update with clipping by `grad_norm` (the global norm) as the fused kernel's grad
        divisor, skipped by the kernel when the norm is NaN/Inf. Returns that flag (bool)."""
        nonfinite = ~torch.isfinite(grad_norm)
        found_inf = nonfinite.float()
        clip = self.config.clip_grad
        divisor = torch.ones_like(grad_norm)
        if clip > 0.0:  # grad / divisor = grad * clip_coefficient; 1 when skipped
            divisor = torch.where(nonfinite, divisor, ((grad_norm + 1.0e-6) / clip).clamp(min=1.0))
        inner = self.optimizer
        inner.grad_scale, inner.found_inf = divisor, found_inf
        try:
            self.step_with_ready_grads()
        finally:
            del inner.grad_scale, inner.found_inf
        return nonfinite

    def _zeros(self):
        return 0


class FP32Optimizer(MegatronOptimizer):
    """fp32 model params stepped directly; grads taken from DDP's main_grad."""

    def _empty_norm(self):
        return None

    def _zeros(self):
        return None

    def prepare_grads(self) -> bool:
        for p in self.get_parameters():
            grad = _model_grad(p)
            if grad is not None and grad is not p.grad:
                p.grad = grad if grad.dtype == p.dtype else grad.to(p.dtype)
        return False

    def step_with_ready_grads(self) -> bool:
        self.optimizer.step()
        return True

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.get_parameters():
            p.grad = None if set_to_none else (p.grad.zero_() if p.grad is not None else None)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)


class MixedPrecisionOptimizer(MegatronOptimizer):
    """Loss-scale handling shared by the fp16/bf16 and distributed optimizers."""

    def __init__(self, optimizer, config, grad_scaler, init_state_fn=lambda x: None):
        super().__init__(optimizer, config, init_state_fn)
        self.grad_scaler = grad_scaler
        if grad_scaler is None and config.fp16:
            raise ValueError(
                "fp16 (True) needs a grad scaler (set loss_scale or use dynamic scaling)"
            )

    def get_loss_scale(self) -> torch.Tensor:
        return torch.tensor([1.0]) if self.grad_scaler is None else self.grad_scaler.scale

    def _copy_model_grads_to_main_grads(self) -> None:
        raise NotImplementedError

    def _unscale_main_grads_and_check_for_nan(self) -> bool:
        """Divide main grads by the loss scale; True if any rank saw inf/NaN."""
        from gigatron.core.optimizer.clip_grads import _stats_device

        grads = [p.grad for p in self.get_parameters() if p.grad is not None]
        device = _stats_device(grads, self.get_grad_stats_parallel_group())
        found_inf = torch.zeros(1, dtype=torch.float32, device=device)
        if grads:  # found_inf and the scale on the grads' device (CUDA under NCCL)
            torch._amp_foreach_non_finite_check_and_unscale_(
                grads, found_inf, self.grad_scaler.inv_scale.to(device)
            )
        if dist.is_initialized():
            # Every rank must agree, or some would step and others not.
            dist.all_reduce(
                found_inf, op=dist.ReduceOp.MAX, group=self.get_grad_stats_parallel_group()
            )
        return bool(found_inf.item() > 0)

    def prepare_grads(self) -> bool:
        self._copy_model_grads_to_main_grads()
        if self.grad_scaler is None:
            return False
        found_inf = self._unscale_main_grads_and_check_for_nan()
        self.grad_scaler.update(found_inf)
        return found_inf


class Float16OptimizerWithFloat16Params(MixedPrecisionOptimizer):
    """bf16/fp16 model params with fp32 main copies owned by the torch optimizer."""

    def __init__(self, optimizer, config, grad_scaler, init_state_fn=lambda x: None):
        super().__init__(optimizer, config, grad_scaler, init_state_fn)
        self.float16_groups: list[list[torch.nn.Parameter]] = []
        self.fp32_from_float16_groups: list[list[torch.nn.Parameter]] = []
        self.fp32_from_fp32_groups: list[list[torch.nn.Parameter]] = []
        for group in self.optimizer.param_groups:
            f16, main, f32 = [], [], []
            for i, param in enumerate(group["params"]):
                if param.dtype in (torch.float16, torch.bfloat16):
                    main_param = torch.nn.Parameter(param.detach().clone().float())
                    _copy_attrs(main_param, param)
                    param.main_param = main_param
                    group["params"][i] = main_param
                    f16.append(param)
                    main.append(main_param)
                elif param.dtype == torch.float32:
                    f32.append(param)
                else:
                    raise ValueError(
                        f"param dtype {param.dtype} must be float16, bfloat16 or float32"
                    )
            self.float16_groups.append(f16)
            self.fp32_from_float16_groups.append(main)
            self.fp32_from_fp32_groups.append(f32)

    def _copy_model_grads_to_main_grads(self) -> None:
        for model_group, main_group in zip(self.float16_groups, self.fp32_from_float16_groups):
            for model_param, main_param in zip(model_group, main_group):
                grad = _model_grad(model_param)
                main_param.grad = None if grad is None else grad.float()
        for group in self.fp32_from_fp32_groups:
            for param in group:
                grad = _model_grad(param)
                if grad is not None and grad is not param.grad:
                    param.grad = grad.float()

    def _copy_main_params_to_model_params(self) -> None:
        # one multi-tensor copy (fp32 -> model dtype) instead of a launch per param
        model = [p.detach() for g in self.float16_groups for p in g]
        main = [p.detach() for g in self.fp32_from_float16_groups for p in g]
        if model:
            torch._foreach_copy_(model, main)

    def step_with_ready_grads(self) -> bool:
        self.optimizer.step()
        self._copy_main_params_to_model_params()
        return True

    def reload_model_params(self, state_dict=None) -> None:
        """Refresh the fp32 main params from the (e.g. freshly loaded) model params."""
        for model_group, main_group in zip(self.float16_groups, self.fp32_from_float16_groups):
            for model_param, main_param in zip(model_group, main_group):
                main_param.data.copy_(model_param.data)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.float16_groups + self.fp32_from_fp32_groups:
            for p in group:
                p.grad = None
        for group in self.fp32_from_float16_groups:
            for p in group:
                p.grad = None

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "grad_scaler": None if self.grad_scaler is None else self.grad_scaler.state_dict(),
            "fp32_from_fp16_params": [
                [p.detach().clone() for p in g] for g in self.fp32_from_float16_groups
            ],
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self.grad_scaler is not None and state_dict.get("grad_scaler") is not None:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
        for group, saved in zip(self.fp32_from_float16_groups, state_dict["fp32_from_fp16_params"]):
            for p, s in zip(group, saved):
                p.data.copy_(s)


class ChainedOptimizer(MegatronOptimizer):
    """Several Megatron optimizers stepped as one (one global grad norm, one skip decision)."""

    def __init__(self, chained_optimizers: list[MegatronOptimizer]):
        self.chained_optimizers = chained_optimizers
        self.config = chained_optimizers[0].config
        self.optimizer = None

    @property
    def param_groups(self):
        return [g for opt in self.chained_optimizers for g in opt.param_groups]

    @property
    def state(self):
        return {k: v for opt in self.chained_optimizers for k, v in opt.state.items()}

    def get_loss_scale(self) -> torch.Tensor:
        return self.chained_optimizers[0].get_loss_scale()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.chained_optimizers:
            opt.zero_grad(set_to_none)

    def reload_model_params(self, state_dict=None) -> None:
        for opt in self.chained_optimizers:
            opt.reload_model_params()

    def prepare_grads(self) -> bool:
        found = False
        for opt in self.chained_optimizers:
            found = opt.prepare_grads() or found  # every one must run (copies grads)
        return found

    def get_grad_norm(self) -> float:
        return sum(opt.get_grad_norm() ** 2 for opt in self.chained_optimizers) ** 0.5

    def _checked_grad_norm(self) -> float:
        return sum(opt._checked_grad_norm() ** 2 for opt in self.chained_optimizers) ** 0.5

    def _empty_norm(self):
        return self.get_grad_norm()  # the global norm is reported even without clipping

    def _clip_grads_by_norm(self, clip_grad: float, grad_norm: float) -> None:
        """Each chained optimizer clips by the one global norm, with its own clip_grad."""
        for opt in self.chained_optimizers:
            if opt.config.clip_grad > 0.0:
                opt._clip_grads_by_norm(opt.config.clip_grad, grad_norm)

    def count_zeros(self) -> float:
        return sum(opt.count_zeros() for opt in self.chained_optimizers)

    def step_with_ready_grads(self) -> bool:
        return all([opt.step_with_ready_grads() for opt in self.chained_optimizers])

    # the sync-free step (MegatronOptimizer._sync_free_step) over the one global norm
    def check_sync_free(self) -> None:
        for opt in self.chained_optimizers:
            opt.check_sync_free()

    def _grad_norm_tensor(self) -> torch.Tensor:
        norms = [opt._grad_norm_tensor() for opt in self.chained_optimizers]
        return torch.stack(norms).pow(2).sum().sqrt()

    def _step_on_device(self, grad_norm: torch.Tensor) -> torch.Tensor:
        nonfinite = [opt._step_on_device(grad_norm) for opt in self.chained_optimizers]
        return nonfinite[0]

    def state_dict(self) -> list[dict]:
        return [opt.state_dict() for opt in self.chained_optimizers]

    def load_state_dict(self, state_dict: list[dict]) -> None:
        for opt, sd in zip(self.chained_optimizers, state_dict):
            opt.load_state_dict(sd)


def _sync_free_problem(opt: MegatronOptimizer) -> str:
    """Why `opt` cannot take the sync-free step ('' when it can)."""
    inner = opt.optimizer
    if not opt.config.clip_grad > 0.0:
        return f"needs clip_grad > 0 (got {opt.config.clip_grad}): the norm is the NaN check"
    if getattr(opt, "grad_scaler", None) is not None:
        return "needs no loss scaler (bf16 or fp32): the loss scale's update is decided on the host"
    if opt.config.log_num_zeros_in_grad:
        return "cannot count zeros (log_num_zeros_in_grad reads the count on the host)"
    if getattr(opt, "_flat_step", None) is not None:
        return ""  # the flat Adam step: its pass takes the clip and skip tensors
    if type(inner) not in (torch.optim.Adam, torch.optim.AdamW):
        return f"needs torch.optim.Adam or AdamW (got {type(inner).__name__})"
    if not all(group.get("fused") for group in inner.param_groups):
        return "needs the fused Adam(W) kernel (CUDA params: gigatron builds it fused there)"
    return ""

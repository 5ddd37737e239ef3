"""Learning-rate warmup/decay and weight-decay increment, set on every optimizer param group.

Mirrors `megatron.core.optimizer_param_scheduler.OptimizerParamScheduler`. Steps are counted in
whatever unit the caller passes to `step(increment)` (Megatron's training loop passes samples:
the global batch size). With n = num_steps, w = lr_warmup_steps, d = lr_decay_steps:

    n <= w (w > 0):        lr = init_lr + (max_lr - init_lr) * n / w
    constant:              lr = max_lr
    n > d:                 lr = min_lr
    inverse-square-root:   lr = max(min_lr, max_lr * sqrt(max(w, 1)) / sqrt(max(n, 1)))
    linear / cosine / WSD: lr = min_lr + coeff * (max_lr - min_lr), r = (n - w) / (d - w),
        linear coeff = 1 - r, cosine coeff = (cos(pi r) + 1) / 2,
        WSD: coeff = 1 until d - wsd_decay_steps, then lr_wsd_decay_style over wsd_decay_steps.

Weight decay goes from start_wd to end_wd over wd_incr_steps (constant / linear / cosine), and
each group gets `weight_decay = wd * group.get("wd_mult", 1.0)`. Groups may override `max_lr`,
`min_lr`, `start_wd`, `end_wd` (Megatron's ParamGroupOverride keys).

Resuming (`load_state_dict`), as Megatron: each saved schedule value must equal this scheduler's
(ScheduleMismatchError names it), unless `override_opt_param_scheduler` (keep this scheduler's
values) or `use_checkpoint_opt_param_scheduler` (take the checkpoint's).
"""

from __future__ import annotations

import logging
import math
from typing import Any, TypedDict

logger = logging.getLogger(__name__)

_FILE = "gigatron/core/optimizer_param_scheduler.py"
_LR_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
_WSD_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")
_WD_STYLES = ("constant", "linear", "cosine")


class ParamGroupOverride(TypedDict, total=False):
    """Per-param-group values the scheduler reads with `group.get(key, default)`."""

    max_lr: float
    min_lr: float
    start_wd: float
    end_wd: float
    wd_mult: float
    optimizer: str


class ScheduleMismatchError(ValueError):
    """A schedule value of the checkpoint differs from this scheduler's (`load_state_dict` with
    neither `override_opt_param_scheduler` nor `use_checkpoint_opt_param_scheduler`).

    `key` is the state-dict key (`lr_decay_steps`, ...), `name` Megatron's wording of it."""

    def __init__(self, key: str, name: str, value: Any, checkpoint_value: Any) -> None:
        self.key, self.name = key, name
        self.value, self.checkpoint_value = value, checkpoint_value
        super().__init__(
            f"OptimizerParamScheduler: class input value {value} and checkpoint value "
            f"{checkpoint_value} for {name} ({key}) do not match: override_opt_param_scheduler="
            "True keeps the class values, use_checkpoint_opt_param_scheduler=True the checkpoint's"
        )


def get_canonical_lr_for_logging(param_groups: list[dict]) -> float | None:
    """lr of the first group on the default schedule (`default_config=True`), for logging."""
    for group in param_groups:
        if group.get("default_config", False):
            return group.get("lr")
    return None


class OptimizerParamScheduler:
    """Anneals learning rate and weight decay of `optimizer.param_groups` (see module doc)."""

    def __init__(
        self,
        optimizer: Any,
        init_lr: float,
        max_lr: float,
        min_lr: float,
        lr_warmup_steps: int,
        lr_decay_steps: int,
        lr_decay_style: str,
        start_wd: float,
        end_wd: float,
        wd_incr_steps: int,
        wd_incr_style: str,
        use_checkpoint_opt_param_scheduler: bool | None = True,
        override_opt_param_scheduler: bool | None = False,
        wsd_decay_steps: int | None = None,
        lr_wsd_decay_style: str | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.init_lr = init_lr
        self.max_lr = float(max_lr)
        self.min_lr = min_lr
        self.lr_warmup_steps = lr_warmup_steps
        self.lr_decay_steps = lr_decay_steps
        self.lr_decay_style = lr_decay_style
        self.wsd_decay_steps = wsd_decay_steps
        self.lr_wsd_decay_style = lr_wsd_decay_style
        self.start_wd = start_wd
        self.end_wd = end_wd
        self.wd_incr_steps = wd_incr_steps
        self.wd_incr_style = wd_incr_style
        self.override_opt_param_scheduler = override_opt_param_scheduler
        self.use_checkpoint_opt_param_scheduler = use_checkpoint_opt_param_scheduler
        self.num_steps = 0
        self._validate()
        self.step(0)
        logger.info("learning rate decay style: %s", self.lr_decay_style)

    def _validate(self) -> None:
        def bad(msg: str) -> ValueError:
            return ValueError(f"OptimizerParamScheduler: {msg} ({_FILE})")

        if self.min_lr < 0.0:
            raise bad(f"min_lr ({self.min_lr}) must be >= 0")
        if self.max_lr < self.min_lr:
            raise bad(f"max_lr ({self.max_lr}) must be >= min_lr ({self.min_lr})")
        if self.init_lr > self.max_lr:
            raise bad(f"init_lr ({self.init_lr}) must be <= max_lr ({self.max_lr})")
        if self.lr_decay_steps <= 0:
            raise bad(f"lr_decay_steps ({self.lr_decay_steps}) must be > 0")
        if self.lr_warmup_steps >= self.lr_decay_steps:
            raise bad(
                f"lr_warmup_steps ({self.lr_warmup_steps}) must be < lr_decay_steps "
                f"({self.lr_decay_steps})"
            )
        if self.lr_decay_style not in _LR_STYLES:
            raise bad(f"lr_decay_style ({self.lr_decay_style!r}) must be one of {_LR_STYLES}")
        if self.lr_decay_style == "WSD":
            if self.wsd_decay_steps is None:
                raise bad("wsd_decay_steps (None) must be set when lr_decay_style is 'WSD'")
            if self.lr_wsd_decay_style not in _WSD_STYLES:
                raise bad(
                    f"lr_wsd_decay_style ({self.lr_wsd_decay_style!r}) must be one of {_WSD_STYLES}"
                )
        if self.start_wd < 0.0:
            raise bad(f"start_wd ({self.start_wd}) must be >= 0")
        if self.end_wd < self.start_wd:
            raise bad(f"end_wd ({self.end_wd}) must be >= start_wd ({self.start_wd})")
        if self.wd_incr_style not in _WD_STYLES:
            raise bad(f"wd_incr_style ({self.wd_incr_style!r}) must be one of {_WD_STYLES}")
        if self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler:
            raise bad(
                "override_opt_param_scheduler and use_checkpoint_opt_param_scheduler (both True) "
                "are mutually exclusive"
            )

    def get_wd(self, param_group: dict | None = None) -> float:
        """Weight decay at the current step (before the group's `wd_mult`)."""
        group = param_group or {}
        start_wd = group.get("start_wd", self.start_wd)
        end_wd = group.get("end_wd", self.end_wd)
        if self.num_steps > self.wd_incr_steps:
            return end_wd
        if self.wd_incr_style == "constant":
            if start_wd != end_wd:
                raise ValueError(
                    f"wd_incr_style 'constant' needs start_wd ({start_wd}) == end_wd ({end_wd}) "
                    f"({_FILE})"
                )
            return end_wd
        ratio = float(self.num_steps) / float(self.wd_incr_steps)
        if self.wd_incr_style == "linear":
            coeff = ratio
        else:  # cosine
            coeff = 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
        return start_wd + coeff * (end_wd - start_wd)

    def get_lr(self, param_group: dict) -> float:
        """Learning rate of `param_group` at the current step (see module doc)."""
        max_lr = param_group.get("max_lr", self.max_lr)
        min_lr = param_group.get("min_lr", self.min_lr)
        n, w, d = self.num_steps, self.lr_warmup_steps, self.lr_decay_steps
        if w > 0 and n <= w:
            return self.init_lr + (max_lr - self.init_lr) * float(n) / float(w)
        if self.lr_decay_style == "constant":
            return max_lr
        if n > d:
            return min_lr
        if self.lr_decay_style == "inverse-square-root":
            lr = max_lr * max(w, 1) ** 0.5 / max(n, 1) ** 0.5
            return max(min_lr, lr)
        ratio = float(n - w) / float(d - w)
        if self.lr_decay_style == "linear":
            coeff = 1.0 - ratio
        elif self.lr_decay_style == "cosine":
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:  # WSD: stable until the last wsd_decay_steps, then anneal
            anneal_start = d - self.wsd_decay_steps
            if n <= anneal_start:
                coeff = 1.0
            else:
                r = float(n - anneal_start) / float(self.wsd_decay_steps)
                coeff = {
                    "linear": lambda: 1.0 - r,
                    "cosine": lambda: 0.5 * (math.cos(math.pi * r) + 1.0),
                    "exponential": lambda: 2.0 * math.pow(0.5, r) - 1.0,
                    "minus_sqrt": lambda: 1.0 - math.sqrt(r),
                }[self.lr_wsd_decay_style]()
        return min_lr + coeff * (max_lr - min_lr)

    def step(self, increment: int) -> None:
        """Advance by `increment` steps and write lr / weight_decay into every param group."""
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr(group)
            group["weight_decay"] = self.get_wd(group) * group.get("wd_mult", 1.0)

    def state_dict(self) -> dict:
        """Megatron's keys, so checkpoints interchange."""
        return {
            "max_lr": self.max_lr,
            "lr_warmup_steps": self.lr_warmup_steps,
            "num_steps": self.num_steps,
            "lr_decay_style": self.lr_decay_style,
            "lr_decay_steps": self.lr_decay_steps,
            "min_lr": self.min_lr,
            "start_wd": self.start_wd,
            "end_wd": self.end_wd,
            "wd_incr_style": self.wd_incr_style,
            "wd_incr_steps": self.wd_incr_steps,
        }

    def _check_and_set(self, cls_value: Any, sd_value: Any, name: str, key: str = "") -> Any:
        """Class value if overriding; else the checkpoint's, which must match the class value
        unless `use_checkpoint_opt_param_scheduler` (ScheduleMismatchError names both)."""
        if self.override_opt_param_scheduler:
            logger.info("overriding %s value to %s", name, cls_value)
            return cls_value
        if not self.use_checkpoint_opt_param_scheduler and cls_value != sd_value:
            raise ScheduleMismatchError(key or name, name, cls_value, sd_value)
        return sd_value

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore from `state_dict()` output (also Megatron's legacy key names)."""

        def first(*keys):
            for key in keys:
                if key in state_dict:
                    return state_dict[key]
            raise KeyError(f"scheduler state_dict has none of {keys}")

        self.max_lr = self._check_and_set(
            self.max_lr, first("start_lr", "max_lr"), "learning rate", "max_lr"
        )
        self.min_lr = self._check_and_set(self.min_lr, state_dict["min_lr"], "minimum lr", "min_lr")
        self.lr_warmup_steps = self._check_and_set(
            self.lr_warmup_steps,
            first("warmup_iter", "warmup_steps", "lr_warmup_steps"),
            "warmup iterations",
            "lr_warmup_steps",
        )
        self.lr_decay_steps = self._check_and_set(
            self.lr_decay_steps,
            first("end_iter", "decay_steps", "lr_decay_steps"),
            "total number of iterations",
            "lr_decay_steps",
        )
        self.lr_decay_style = self._check_and_set(
            self.lr_decay_style,
            first("decay_style", "lr_decay_style"),
            "lr decay style",
            "lr_decay_style",
        )
        self.num_steps = 0
        self.step(increment=first("num_iters", "num_steps"))
        if "start_wd" in state_dict:
            self.start_wd = self._check_and_set(
                self.start_wd, state_dict["start_wd"], "start wd", "start_wd"
            )
            self.end_wd = self._check_and_set(self.end_wd, state_dict["end_wd"], "end wd", "end_wd")
            self.wd_incr_steps = self._check_and_set(
                self.wd_incr_steps,
                state_dict["wd_incr_steps"],
                "wd increment iterations",
                "wd_incr_steps",
            )
            self.wd_incr_style = self._check_and_set(
                self.wd_incr_style,
                state_dict["wd_incr_style"],
                "wd increment style",
                "wd_incr_style",
            )

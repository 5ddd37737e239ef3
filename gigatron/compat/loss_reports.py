"""The list the schedules return: per-microbatch loss reports, with helpful misuse errors.

Megatron's schedules return a plain list of whatever `loss_func` reported (usually dicts like
`{"lm loss": tensor}`), one per microbatch, on the last pipeline stage, [] elsewhere. Backward has
already run. Third-party tutorials sometimes treat it as a loss tensor, e.g.
`scaler.scale(losses).backward()` with `torch.amp.GradScaler`: on a plain list that fails with
"'list' object has no attribute 'backward'". `LossReports` is a `list` (equal to, and used
exactly like, Megatron's) whose tensor-only methods raise a TypeError saying what to use instead.
`GradScaler.scale(list)` rebuilds the same type, so the error also reaches that path.

Leaf module: imports nothing from gigatron (see `gigatron.compat`).
"""

from __future__ import annotations

_WHAT_TO_USE = (
    "the schedule already ran backward for every microbatch; it returns a list of the reports "
    "loss_func returned (one per microbatch, e.g. {'lm loss': tensor}), not a loss tensor. "
    "Do not pass it to torch.amp.GradScaler / torch.cuda.amp.GradScaler or call {name}() on "
    "it. For loss scaling use the Megatron optimizer: optimizer = get_megatron_optimizer("
    "OptimizerConfig(fp16=True, ...), model) and config.grad_scale_func = optimizer.scale_loss "
    "(the schedule scales each loss before its backward), then optimizer.step() unscales, "
    "skips overflow steps and updates the scale. Read losses as [d['lm loss'] for d in losses] "
    "(docs/compat.md)"
)


# what a loss tensor has and a list does not: each raises the TypeError below
TENSOR_METHODS = ("backward", "item", "detach", "float", "mean", "sum", "to", "cuda")


class LossReports(list):
    """list of per-microbatch loss reports; `.backward()` / `.item()` etc. explain the mistake."""

    def _misuse(self, name: str):
        def fail(*args, **kwargs):
            raise TypeError(
                f"{name}() called on the schedule's list of loss reports: "
                + _WHAT_TO_USE.replace("{name}", name)
            )

        return fail

    def __truediv__(self, other):
        raise TypeError(
            f"the schedule's list of loss reports cannot be divided by {other!r}: gradient "
            "accumulation is the schedule's num_microbatches (forward_backward_func("
            "num_microbatches=accumulation_steps, ...) runs them all and divides each loss by "
            "num_microbatches before its backward), and the list holds the reports loss_func "
            "returned, one per microbatch (e.g. {'lm loss': tensor}); average them with "
            "sum(d['lm loss'] for d in losses) / len(losses) (docs/compat.md)"
        )

    __floordiv__ = __itruediv__ = __truediv__

    def __getattr__(self, name: str):
        if name in TENSOR_METHODS:
            return self._misuse(name)
        raise AttributeError(f"{type(self).__name__!r} (a list) has no attribute {name!r}")

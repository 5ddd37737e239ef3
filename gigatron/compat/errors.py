"""Exception types for the places where Megatron asserts and gigatron raises a named error.

Megatron Core guards state and arguments with `assert`, so its own tests and some user code
catch AssertionError; gigatron raises RuntimeError (wrong state) or ValueError (bad input), as
its style rules ask (an assert vanishes under `python -O`). These classes are both, so either
`except` clause catches them:

    StateError            AssertionError + RuntimeError: parallel_state used before
                          torch.distributed / initialize_model_parallel, a calculator set twice
    ArgumentError         AssertionError + ValueError: an argument Megatron checks with assert

Leaf module: imports nothing from gigatron (see `gigatron.compat`).
"""

from __future__ import annotations

__all__ = ["ArgumentError", "StateError"]


class StateError(AssertionError, RuntimeError):
    """Wrong global state (Megatron: AssertionError; gigatron's callers: RuntimeError)."""


class ArgumentError(AssertionError, ValueError):
    """A bad argument (Megatron: AssertionError; gigatron's callers: ValueError)."""

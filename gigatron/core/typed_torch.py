"""Megatron's typing helpers for torch interfaces: `apply_module` (a module seen as its
`forward`), `not_none` (an Optional narrowed, ValueError on None) and `copy_signature` (a
wrapper that takes another callable's parameters for `inspect.signature` and type checkers)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import torch

__all__ = ["apply_module", "copy_signature", "not_none"]

T = TypeVar("T")


def apply_module(m, *, check_subclass: bool = True):
    """`m` unchanged, typed as its forward; TypeError when `check_subclass` and `m` is not a
    torch.nn.Module."""
    if check_subclass and not isinstance(m, torch.nn.Module):
        raise TypeError(f"{type(m)} is not a subclass of torch.nn.Module")
    return m


def not_none(value: T | None) -> T:
    """`value`, which must not be None (ValueError)."""
    if value is None:
        raise ValueError("Expected value to be not None")
    return value


_CHOICES = {
    "handle_return_type": ("preserve", "overwrite"),
    "handle_first_src_param": ("copy", "skip"),
    "handle_first_dst_param": ("preserve", "drop"),
}


def copy_signature(
    source: Callable[..., Any],
    /,
    *,
    handle_return_type: Literal["preserve", "overwrite"] = "preserve",
    handle_first_src_param: Literal["copy", "skip"] = "copy",
    handle_first_dst_param: Literal["preserve", "drop"] = "drop",
):
    """Decorator: the decorated callable's `__signature__` becomes `source`'s parameters.

    handle_return_type: 'preserve' keeps the decorated callable's return annotation,
        'overwrite' takes `source`'s.
    handle_first_src_param: 'skip' leaves out `source`'s first parameter (its self / cls).
    handle_first_dst_param: 'preserve' keeps the decorated callable's first parameter in front
        (a method's self / cls), 'drop' replaces it like the others.
    The decorated callable itself is returned (behaviour unchanged).
    """
    given = dict(
        handle_return_type=handle_return_type,
        handle_first_src_param=handle_first_src_param,
        handle_first_dst_param=handle_first_dst_param,
    )
    for key, value in given.items():
        if value not in _CHOICES[key]:
            raise ValueError(f"copy_signature: {key}={value!r} must be one of {_CHOICES[key]}")
    src = inspect.signature(source)

    def decorate(decorated: Callable[..., Any], /) -> Callable[..., Any]:
        dst = inspect.signature(decorated)
        params = list(src.parameters.values())
        if handle_first_src_param == "skip":
            params = params[1:]
        if handle_first_dst_param == "preserve":
            params = [next(iter(dst.parameters.values())), *params]
        sig = dst.replace(parameters=params)
        if handle_return_type == "overwrite":
            sig = sig.replace(return_annotation=src.return_annotation)
        decorated.__signature__ = sig
        return decorated

    return decorate

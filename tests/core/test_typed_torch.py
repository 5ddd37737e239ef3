"""megatron.core.typed_torch: apply_module, not_none, copy_signature."""

import inspect

import pytest
import torch

from gigatron.core.typed_torch import apply_module, copy_signature, not_none

P = inspect.Parameter


def source(a: int, *, b: str) -> str:
    return f"{a}{b}"


class Source:
    def method(self, a: int, *, b: str) -> str:
        return f"{a}{b}"


def test_apply_module_returns_the_module_and_checks_its_type():
    lin = torch.nn.Linear(2, 2)
    assert apply_module(lin) is lin
    with pytest.raises(TypeError, match="not a subclass of torch.nn.Module"):
        apply_module(object())
    thing = object()
    assert apply_module(thing, check_subclass=False) is thing


def test_not_none():
    assert not_none(0) == 0
    with pytest.raises(ValueError, match="Expected value to be not None"):
        not_none(None)


def test_copy_signature_takes_the_parameters_and_keeps_the_return_type():
    @copy_signature(source)
    def wrapper(*args, **kwargs) -> list:
        return [source(*args, **kwargs)]

    assert wrapper(1, b="x") == ["1x"]
    assert inspect.signature(wrapper) == inspect.Signature(
        [P("a", P.POSITIONAL_OR_KEYWORD, annotation=int), P("b", P.KEYWORD_ONLY, annotation=str)],
        return_annotation=list,
    )


def test_copy_signature_overwrite_skip_and_preserve():
    @copy_signature(Source.method, handle_return_type="overwrite", handle_first_src_param="skip")
    def from_method(*args, **kwargs) -> object: ...

    assert list(inspect.signature(from_method).parameters) == ["a", "b"]
    assert inspect.signature(from_method).return_annotation is str

    class Dest:
        @copy_signature(source, handle_first_dst_param="preserve")
        def method(self, *args, **kwargs) -> int: ...

    assert list(inspect.signature(Dest.method).parameters) == ["self", "a", "b"]
    assert inspect.signature(Dest.method).return_annotation is int


def test_copy_signature_refuses_an_unknown_choice():
    with pytest.raises(ValueError, match="handle_return_type='keep'"):
        copy_signature(source, handle_return_type="keep")

"""spec_utils.import_module: (module, name) -> the object; ImportError names what is missing."""

import pytest

from gigatron.core.transformer import identity_op
from gigatron.core.transformer.spec_utils import import_module


def test_imports_the_named_object():
    assert import_module(("gigatron.core.transformer.identity_op", "IdentityOp")) is (
        identity_op.IdentityOp
    )


def test_missing_module_is_import_error_naming_it():
    with pytest.raises(ImportError, match="Could not import module 'gigatron.core.nope'"):
        import_module(("gigatron.core.nope", "spec"))


def test_missing_attribute_is_import_error_naming_spec_and_module():
    with pytest.raises(
        ImportError,
        match="Could not find spec 'nope' in module 'gigatron.core.transformer.identity_op'",
    ):
        import_module(("gigatron.core.transformer.identity_op", "nope"))

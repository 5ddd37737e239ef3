"""MoE modules' `__getattr__` follows Python's protocol: AttributeError for missing names (so
hasattr is False), while `from ... import MoEMLP` still raises ImportError naming what to use
(gigatron.compat.missing_names: through the import system, never the caller's frame)."""

import importlib
import inspect
import re
import subprocess
import sys

import pytest

MODULES = [
    "gigatron.core.transformer.mlp",
    "gigatron.core.transformer.moe",
    "gigatron.core.transformer.moe.experts",
    "gigatron.core.transformer.moe.moe_layer",
]


@pytest.mark.parametrize("module_name", MODULES)
def test_hasattr_is_false_and_attribute_error_keeps_the_hint(module_name):
    mod = importlib.import_module(module_name)
    assert hasattr(mod, "MoEMLP") is False
    assert getattr(mod, "Router", "fallback") == "fallback"
    with pytest.raises(AttributeError, match=r"no 'MoEMLP'.*SequentialMLP or GroupedMLP"):
        mod.MoEMLP  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        mod.NoSuchThing  # noqa: B018
    assert not hasattr(mod, "NoSuchThing")


def test_from_import_raises_import_error_with_the_hint():
    with pytest.raises(ImportError, match=r"moe has no 'MoEMLP'.*SequentialMLP or GroupedMLP"):
        from gigatron.core.transformer.moe import MoEMLP  # noqa: F401
    with pytest.raises(ImportError, match=r"moe_layer has no 'Router'.*TopKRouter"):
        from gigatron.core.transformer.moe.moe_layer import Router  # noqa: F401
    with pytest.raises(ImportError, match=r"experts has no 'Experts'.*GroupedMLP"):
        from gigatron.core.transformer.moe.experts import Experts, SequentialMLP  # noqa: F401
    with pytest.raises(ImportError, match=r"mlp has no 'MoEMLP'.*SequentialMLP or GroupedMLP"):
        from gigatron.core.transformer.mlp import MLP, MoEMLP  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name 'NoSuchThing'"):
        from gigatron.core.transformer.moe import NoSuchThing  # noqa: F401
    with pytest.raises(ImportError, match="cannot import name 'NoSuchThing'"):
        from gigatron.core.transformer.mlp import NoSuchThing  # noqa: F401,F811


def test_from_import_through_the_megatron_alias():
    # own process: the alias refuses to install beside an imported real megatron
    code = (
        "import gigatron.compat.megatron as m; m.install()\n"
        "try:\n    from megatron.core.transformer.mlp import MoEMLP\n"
        "except ImportError as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert re.search(r"^ImportError .*mlp has no 'MoEMLP'.*SequentialMLP", out.stdout, re.M), out


def test_no_frame_or_bytecode_inspection():
    from gigatron.compat import missing_names

    source = inspect.getsource(missing_names)
    assert "_getframe" not in source and "import dis" not in source and "f_lasti" not in source


def test_real_names_still_resolve():
    from gigatron.core.transformer.moe import MoELayer, TopKRouter
    from gigatron.core.transformer.moe.moe_layer import MoELayer as direct

    moe = importlib.import_module("gigatron.core.transformer.moe")
    assert MoELayer is direct and hasattr(moe, "TopKRouter") and TopKRouter.__name__ == "TopKRouter"

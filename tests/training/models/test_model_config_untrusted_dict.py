"""ModelConfig.from_dict reads dicts that may come from a file: `_target_` must pass the target
allowlist and name a dataclass, `builder` a ModelBuilder subclass; nothing else is imported or
called, and each refusal is one line naming the key and the value."""

from dataclasses import dataclass

import pytest

from gigatron.training._target_allowlist import target_allowlist
from gigatron.training.models import ModelBuilder, ModelConfig


@dataclass
class TinyConfig(ModelConfig):
    hidden: int = 8


class TinyBuilder(ModelBuilder):
    def build_model(self, *args, **kwargs):  # pragma: no cover - never called here
        raise NotImplementedError

    def build_distributed_models(self, *args, **kwargs):  # pragma: no cover
        raise NotImplementedError


HERE = __name__ + "."


@pytest.fixture
def this_module_allowed():
    target_allowlist.add_prefix(HERE)
    yield
    target_allowlist.remove_prefix(HERE)


def test_round_trip_of_an_allowed_config(this_module_allowed):
    cfg = TinyConfig(hidden=16)
    cfg.builder = HERE + "TinyBuilder"
    back = ModelConfig.from_dict(cfg.as_dict())
    assert isinstance(back, TinyConfig) and back.hidden == 16
    assert back.get_builder_cls() is TinyBuilder


@pytest.mark.parametrize(
    "target, why",
    [
        ("os.system", "not in the target allowlist"),
        ("builtins.eval", "not in the target allowlist"),
        ("torch.load", "is not a dataclass"),  # admitted by the torch. prefix, but a function
        ("gigatron.training.models.base.nope", "cannot be imported"),
    ],
)
def test_refused_targets(target, why):
    with pytest.raises(ValueError, match=why) as err:
        ModelConfig.from_dict({"_target_": target, "_builder_": "x"})
    assert "\n" not in str(err.value) and repr(target) in str(err.value)


def test_a_builder_must_be_a_model_builder():
    cfg = ModelConfig()
    cfg.builder = "gigatron.training.models.base.ModelConfig"
    with pytest.raises(ValueError, match="not a ModelBuilder subclass"):
        cfg.get_builder_cls()

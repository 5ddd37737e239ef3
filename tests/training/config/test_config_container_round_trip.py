"""ConfigContainerBase: a PretrainConfigContainer written by to_yaml reads back equal through
from_yaml; from_dict's STRICT / LENIENT extra keys; sanitize_dataclass_config drops init=False
fields; safe_yaml_representers writes functions, partials, enums and dtypes as _target_ maps and
restores SafeDumper; Serializable is structural."""

from __future__ import annotations

import dataclasses
import enum
import functools

import pytest
import torch
import yaml

from gigatron.core.optimizer import OptimizerConfig
from gigatron.training.config import (
    CheckpointConfig,
    LoggerConfig,
    PretrainConfigContainer,
    SchedulerConfig,
    TrainingConfig,
    ValidationConfig,
)
from gigatron.training.config.instantiate_utils import InstantiationMode
from gigatron.training.config.utils import sanitize_dataclass_config
from gigatron.training.config.yaml_utils import safe_yaml_representers
from gigatron.training.models import Serializable


def _container() -> PretrainConfigContainer:
    return PretrainConfigContainer(
        train=TrainingConfig(micro_batch_size=2, global_batch_size=8, train_iters=11),
        validation=ValidationConfig(eval_interval=5, start_eval_at_iter=10),
        model=None,
        optimizer=OptimizerConfig(lr=3e-4, params_dtype=torch.bfloat16),
        scheduler=SchedulerConfig(lr_decay_style="cosine"),
        logger=LoggerConfig(),
        checkpoint=CheckpointConfig(save="/tmp/ckpt"),
    )


def test_yaml_round_trip_gives_an_equal_container(tmp_path):
    config = _container()
    path = tmp_path / "run.yaml"
    config.to_yaml(str(path))
    assert (
        "_target_: gigatron.training.config.container.PretrainConfigContainer" in path.read_text()
    )
    back = PretrainConfigContainer.from_yaml(str(path))
    for f in dataclasses.fields(config):
        if f.name != "ddp":  # its tuple field comes back a list, as in Megatron
            assert getattr(back, f.name) == getattr(config, f.name), f.name
    assert back.optimizer.params_dtype is torch.bfloat16
    assert back.validation.start_eval_at_iter == 10


def test_from_dict_strict_refuses_extra_keys_lenient_drops_them():
    d = _container().to_dict()
    d["not_a_field"] = 1
    with pytest.raises(ValueError, match="not_a_field"):
        PretrainConfigContainer.from_dict(d, mode=InstantiationMode.STRICT)
    back = PretrainConfigContainer.from_dict(d, mode=InstantiationMode.LENIENT)
    assert back.train == _container().train
    assert "not_a_field" in d  # the caller's dict is not changed


def test_from_yaml_of_a_missing_file():
    with pytest.raises(FileNotFoundError, match="no_such.yaml"):
        PretrainConfigContainer.from_yaml("no_such.yaml")


@dataclasses.dataclass
class _WithComputed:
    name: str = "a"
    derived: str = dataclasses.field(init=False, default="")


def test_sanitize_drops_init_false_fields(monkeypatch):
    from gigatron.training.config import utils

    monkeypatch.setattr(utils, "_resolve_target_class", lambda target: _WithComputed)
    d = {"_target_": "x._WithComputed", "name": "b", "derived": "old", "inner": [{"derived": 1}]}
    out = sanitize_dataclass_config(d)
    assert out == {"_target_": "x._WithComputed", "name": "b", "inner": [{"derived": 1}]}


class _Color(enum.Enum):
    RED = 1


def test_representers_write_targets_and_are_restored():
    before = dict(yaml.SafeDumper.yaml_multi_representers)
    value = {
        "act": torch.nn.functional.silu,
        "init": functools.partial(torch.nn.init.normal_, std=0.02),
        "color": _Color.RED,
        "dtype": torch.float16,
    }
    with safe_yaml_representers():
        text = yaml.safe_dump(value)
    data = yaml.safe_load(text)
    assert data["act"] == {"_target_": "torch.nn.functional.silu", "_call_": False}
    assert data["init"] == {
        "_target_": "torch.nn.init.normal_", "_partial_": True, "_args_": [], "std": 0.02
    }  # fmt: skip
    assert data["color"]["_args_"] == [1] and data["color"]["_name_"] == "RED"
    assert data["dtype"] == {"_target_": "torch.float16", "_call_": False}
    assert yaml.SafeDumper.yaml_multi_representers == before
    with pytest.raises(yaml.representer.RepresenterError):
        yaml.safe_dump({"dtype": torch.float16})


def test_serializable_is_structural():
    class Both:
        def as_dict(self):
            return {"_target_": "x"}

        @classmethod
        def from_dict(cls, data):
            return cls()

    assert isinstance(Both(), Serializable)
    assert not isinstance(object(), Serializable)
    assert PretrainConfigContainer._convert_value_to_dict(Both()) == {"_target_": "x"}

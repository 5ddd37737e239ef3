"""instantiate_utils: a config file names only allowlisted targets, and a name admitted by a
default prefix (torch., megatron.core., ...) is called only if it is a config class; every
refusal is one line naming the target, the key and (from_yaml) the file."""

from __future__ import annotations

import functools

import pytest
import torch

from gigatron.training.config import PretrainConfigContainer, TrainingConfig
from gigatron.training.config import instantiate_utils as iu
from gigatron.training.config.instantiate_utils import (
    InstantiationException,
    InstantiationMode,
    TargetAllowlist,
    instantiate,
)

_TRAIN = "gigatron.training.config.training_config.TrainingConfig"


@pytest.fixture(autouse=True)
def fresh_allowlist(monkeypatch):
    allowlist = TargetAllowlist()
    monkeypatch.setattr(iu, "target_allowlist", allowlist)
    return allowlist


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_config_classes_enums_and_dtypes_are_built():
    cfg = {"_target_": _TRAIN, "micro_batch_size": 3, "train_iters": 7}
    assert instantiate(cfg) == TrainingConfig(micro_batch_size=3, train_iters=7)
    assert instantiate({"_target_": "torch.bfloat16", "_call_": False}) is torch.bfloat16
    sig = instantiate({"_target_": "signal.Signals", "_args_": [15]})
    assert sig.name == "SIGTERM"
    init = instantiate({"_target_": "torch.nn.init.normal_", "_partial_": True, "std": 0.02})
    assert isinstance(init, functools.partial) and init.keywords == {"std": 0.02}


@pytest.mark.parametrize("target", ["os.system", "builtins.eval", "subprocess.Popen"])
def test_a_target_outside_the_allowlist_is_refused_before_import(target):
    with pytest.raises(InstantiationException, match="not in the allowlist") as e:
        instantiate({"_target_": _TRAIN, "train_iters": {"_target_": target, "_args_": ["x"]}})
    text = _one_line(e)
    assert target in text and "full_key: train_iters" in text


@pytest.mark.parametrize("target", ["torch.load", "torch.hub.load", "torch.save"])
def test_a_default_prefix_callable_that_is_not_a_config_class_is_not_called(target, tmp_path):
    cfg = {"_target_": target, "_args_": [str(tmp_path / "x.pt")]}
    with pytest.raises(InstantiationException, match="may not be called") as e:
        instantiate(cfg)
    assert target in _one_line(e)
    assert not (tmp_path / "x.pt").exists()


def test_partial_cannot_wrap_a_callable_that_reads_files():
    cfg = {
        "_target_": "functools.partial",
        "_args_": [{"_target_": "torch.load", "_call_": False}, "evil.pt"],
    }
    with pytest.raises(InstantiationException, match="may not be wrapped in a partial") as e:
        instantiate(cfg)
    assert "torch.serialization.load" in _one_line(e)
    with pytest.raises(InstantiationException, match="may not be wrapped in a partial"):
        instantiate({"_target_": "torch.load", "_partial_": True, "f": "evil.pt"})


def test_naming_a_module_is_refused():
    with pytest.raises(InstantiationException, match="may not be named"):
        instantiate({"_target_": "torch.os", "_call_": False})


def test_a_target_the_program_adds_skips_the_kind_check(fresh_allowlist):
    fresh_allowlist.add_exact("os.path.join")
    assert instantiate({"_target_": "os.path.join", "_args_": ["a", "b"]}) == "a/b"


def test_strict_mode_refuses_keys_the_target_does_not_take():
    cfg = {"_target_": _TRAIN, "micro_batch_size": 2, "no_such_field": 1}
    assert instantiate(cfg).micro_batch_size == 2  # LENIENT drops it
    with pytest.raises(InstantiationException, match="no_such_field"):
        instantiate(cfg, mode=InstantiationMode.STRICT)


def test_interpolation_without_omegaconf_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(iu, "_omegaconf", lambda: None)
    cfg = {"_target_": _TRAIN, "train_iters": 5, "exit_interval": "${train_iters}"}
    with pytest.raises(ImportError, match="need omegaconf"):
        instantiate(cfg)


def test_from_yaml_names_the_file_and_key_of_a_refused_target(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "_target_: gigatron.training.config.container.PretrainConfigContainer\n"
        "train:\n  _target_: torch.load\n  f: /etc/passwd\n"
    )
    with pytest.raises(InstantiationException) as e:
        PretrainConfigContainer.from_yaml(str(path))
    text = _one_line(e)
    assert str(path) in text and "torch.load" in text and "full_key: train" in text


def test_from_yaml_refuses_python_tags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("_target_: !!python/name:os.system\n")
    with pytest.raises(ValueError, match="python/name"):
        PretrainConfigContainer.from_yaml(str(path))


def test_missing_values_are_skipped_in_a_partial_and_refused_in_a_call():
    cfg = {"_target_": _TRAIN, "micro_batch_size": 4, "train_iters": "???"}
    part = instantiate({**cfg, "_partial_": True})
    assert part(train_iters=3) == TrainingConfig(micro_batch_size=4, train_iters=3)
    with pytest.raises(
        InstantiationException, match="Missing mandatory value for key 'train_iters'"
    ):
        instantiate(cfg)


def test_a_tensor_passed_as_a_keyword_is_kept():
    t = torch.ones(2)
    cfg = {"_target_": "functools.partial", "_args_": [{"_target_": _TRAIN, "_call_": False}]}
    part = instantiate(cfg, global_batch_size=t)
    assert part.keywords["global_batch_size"] is t

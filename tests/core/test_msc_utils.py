"""megatron.core.msc_utils without the multistorageclient package: the switch never counts as
on and maybe_msc is the local file system."""

import builtins
import os
import pickle
from pathlib import Path

import pytest
import torch

from gigatron.core import msc_utils
from gigatron.core.msc_utils import MultiStorageClientFeature, maybe_msc


@pytest.fixture
def no_msc(monkeypatch):
    monkeypatch.setattr(msc_utils, "msc", None)
    monkeypatch.setattr(MultiStorageClientFeature, "_enabled", False)


def test_local_names_without_the_package(no_msc):
    assert maybe_msc.open is builtins.open and maybe_msc.os is os
    assert maybe_msc.Path is Path and maybe_msc.torch is torch
    assert set(dir(maybe_msc)) == {"open", "os", "Path", "torch"}
    with pytest.raises(AttributeError, match="no_such_name"):
        maybe_msc.no_such_name  # noqa: B018


def test_enable_is_remembered_but_off_without_the_package(no_msc):
    MultiStorageClientFeature.enable()
    assert MultiStorageClientFeature._enabled and not MultiStorageClientFeature.is_enabled()
    with pytest.raises(RuntimeError, match="not installed"):
        MultiStorageClientFeature.import_package()
    MultiStorageClientFeature.disable()
    assert not MultiStorageClientFeature._enabled


def test_path_isdir_is_os_path_isdir(no_msc, tmp_path):
    assert maybe_msc.path_isdir(str(tmp_path)) is True
    assert maybe_msc.path_isdir(str(tmp_path / "absent")) is False


def test_enabled_package_answers_first(monkeypatch):
    class FakeMsc:
        open = "msc-open"

        class os:  # noqa: N801 (the package's module attribute)
            class path:  # noqa: N801
                isdir = staticmethod(lambda p, strict=True: ("msc", p, strict))

    monkeypatch.setattr(msc_utils, "msc", FakeMsc)
    monkeypatch.setattr(MultiStorageClientFeature, "_enabled", True)
    assert maybe_msc.open == "msc-open" and maybe_msc.Path is Path  # absent there: local
    assert maybe_msc.path_isdir("s3://b/x", strict=False) == ("msc", "s3://b/x", False)
    MultiStorageClientFeature.disable()
    with pytest.raises(RuntimeError, match="feature is off"):
        MultiStorageClientFeature.import_package()


def test_flag_pickles_its_switch_only():
    flag = msc_utils._FeatureFlag(default=True)
    back = pickle.loads(pickle.dumps(flag))
    assert back._enabled is True and back.__dict__ == {"_enabled": True}

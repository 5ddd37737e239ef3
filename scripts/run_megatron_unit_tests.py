"""Run Megatron-LM's own unit tests against gigatron (`megatron` imported as `gigatron`), on CPU.

    git clone https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM   # its tests, not gigatron's
    python scripts/run_megatron_unit_tests.py /tmp/Megatron-LM --collect-only
    python scripts/run_megatron_unit_tests.py /tmp/Megatron-LM tests/unit_tests/test_utils.py -x

Arguments after the checkout are handed to pytest (paths relative to the checkout; default
`tests/unit_tests`). The runner installs `gigatron.compat.megatron`'s alias and skips Megatron's
conftests (they download data sets and import Transformer Engine; their `tmp_path_dist_ckpt`
fixture is provided here, and a small stand-in for pytest-mock's `mocker`). It adapts
the one piece of their scaffolding that needs CUDA:
`Utils.initialize_distributed` starts a one-rank gloo world instead of NCCL.
`megatron.training.argument_utils` (imported by that scaffolding only) is a stub when gigatron
lacks it, and `mock` is the standard library's `unittest.mock` when not installed. Nothing of
Megatron's is copied into gigatron. At the end the runner prints how many test files failed to
import, after pytest's own counts. Megatron's tests mostly expect 8 GPUs: on one CPU rank,
count import failures and passes, not failures.
"""

from __future__ import annotations

import os
import sys
import types
from datetime import timedelta
from pathlib import Path

import pytest


def _stub_scaffold_imports() -> None:
    import importlib.util

    name = "megatron.training.argument_utils"
    if importlib.util.find_spec("gigatron.training.argument_utils") is None:
        stub = types.ModuleType(name)
        for fn in (
            "gpt_config_from_args",
            "hybrid_config_from_args",
            "pretrain_cfg_container_from_args",
            "ArgumentGroupFactory",
        ):
            setattr(stub, fn, _not_here(fn))
        sys.modules[name] = stub


def _mock_package() -> None:
    """Megatron's tests `import mock` (the PyPI backport; the standard library's is the same)
    and `from pytest_mock import MockerFixture, mocker` (hints and the fixture: ours)."""
    import importlib.util
    import unittest.mock

    if importlib.util.find_spec("mock") is None:
        sys.modules["mock"] = unittest.mock
    if importlib.util.find_spec("pytest_mock") is None:  # imported for MockerFixture hints
        stand_in = types.ModuleType("pytest_mock")
        stand_in.MockerFixture = stand_in.MockFixture = types.SimpleNamespace
        stand_in.mocker = mocker  # some tests import the fixture itself
        sys.modules["pytest_mock"] = stand_in


def _not_here(fn: str):
    def call(*args, **kwargs):
        raise NotImplementedError(f"{fn}: Megatron-LM test scaffolding, not in gigatron")

    return call


def _one_rank_gloo() -> None:
    import torch
    from tests.unit_tests.test_utilities import Utils

    def initialize_distributed():
        if not torch.distributed.is_initialized():
            store = torch.distributed.HashStore()
            torch.distributed.init_process_group(
                "gloo", world_size=1, rank=0, store=store, timeout=timedelta(minutes=1)
            )
        Utils.inited = True

    Utils.world_size, Utils.rank, Utils.local_rank = 1, 0, 0
    Utils.initialize_distributed = staticmethod(initialize_distributed)


@pytest.fixture(scope="session")
def tmp_path_dist_ckpt(tmp_path_factory):
    """Megatron's conftest fixture: one directory shared by the ranks (one rank here)."""
    return tmp_path_factory.mktemp("tmp_dist_ckpt")


@pytest.fixture
def mocker():
    """pytest-mock's fixture, the parts Megatron's tests use (patch, spy, Mock, ...)."""
    patcher = _Patcher()
    yield patcher.mocker
    for p in reversed(patcher.started):
        p.stop()


class _Summary:
    """Counts test files that failed to import."""

    def __init__(self) -> None:
        self.import_errors: list[str] = []

    def pytest_collectreport(self, report):
        if report.failed:
            self.import_errors.append(report.nodeid)


class _Patcher:
    def __init__(self) -> None:
        from unittest import mock

        self.started: list = []
        start = self._start

        class patch:
            def __new__(cls, target, *args, **kwargs):
                return start(mock.patch(target, *args, **kwargs))

            object = staticmethod(lambda *a, **k: start(mock.patch.object(*a, **k)))
            dict = staticmethod(lambda *a, **k: start(mock.patch.dict(*a, **k)))
            multiple = staticmethod(lambda *a, **k: start(mock.patch.multiple(*a, **k)))

        self.mocker = types.SimpleNamespace(
            patch=patch, Mock=mock.Mock, MagicMock=mock.MagicMock, PropertyMock=mock.PropertyMock,
            ANY=mock.ANY, call=mock.call, sentinel=mock.sentinel,
            spy=lambda obj, name: start(mock.patch.object(obj, name, wraps=getattr(obj, name))),
            stopall=lambda: [p.stop() for p in reversed(self.started)],
        )  # fmt: skip

    def _start(self, p):
        self.started.append(p)
        return p.start()


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    checkout = Path(argv[0]).resolve()
    if not (checkout / "tests" / "unit_tests").is_dir():
        print(f"{checkout}: no tests/unit_tests here (a Megatron-LM checkout?)", file=sys.stderr)
        return 2
    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0")

    import gigatron.compat.megatron as alias

    alias.install()
    _stub_scaffold_imports()
    _mock_package()
    _one_rank_gloo()

    rest = argv[1:] or ["tests/unit_tests"]
    args = ["--noconftest", "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
    args += ["--continue-on-collection-errors", *rest]
    summary = _Summary()
    code = pytest.main(args, plugins=[summary, sys.modules[__name__]])  # + this file's fixtures
    print(f"megatron-on-gigatron: {len(summary.import_errors)} files failed to import")
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

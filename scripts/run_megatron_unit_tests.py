"""Run Megatron-LM's own unit tests against gigatron (`megatron` imported as `gigatron`), on CPU.

    git clone https://github.com/NVIDIA/Megatron-LM /tmp/Megatron-LM   # its tests, not gigatron's
    python scripts/run_megatron_unit_tests.py /tmp/Megatron-LM --collect-only
    python scripts/run_megatron_unit_tests.py /tmp/Megatron-LM tests/unit_tests/test_utils.py -x
    python scripts/run_megatron_unit_tests.py /tmp/Megatron-LM --nproc 1,2,4,8 \
        --file-timeout 120 --report bench/reports/megatron-unit-tests.md

Without --nproc: one pytest session, one rank, in this process; arguments after the checkout
are pytest's (paths relative to the checkout; default `tests/unit_tests`). With --nproc N[,N..]
(scripts/megatron_launch.py): for each N, each test directory is one pytest session under
`torchrun --nproc-per-node N`, as Megatron's CI runs them; the files that import a CUDA-only
package at module level are left out (scripts/megatron_test_results.py says which); rank 0's
results are read live, a file running longer than --file-timeout seconds (default 120) is
stopped and the session goes on after it; --report writes the markdown report, --results
every test's outcome and message as JSON. --jobs J runs J test directories at once (a
machine with J x N cores); --render A.json,B.json --report R.md writes one report from the
--results files of runs at different world sizes.

Third-party packages Megatron's tests import and gigatron does not need (msgpack, nltk,
omegaconf, aiohttp, wrapt: requirements-megatron-tests.txt) come from `.venv-megatron-tests`
(`make megatron-test-deps`), or the folder given with --deps DIR: it goes at the end of every
test process's sys.path, so the packages of the running Python always win.

Every rank installs `gigatron.compat.megatron`'s alias and skips Megatron's conftests (they
download data sets and import Transformer Engine; their `tmp_path_dist_ckpt` fixture is provided
here, and a small stand-in for pytest-mock's `mocker`). Megatron's `Utils` runs unchanged: inside
its calls `torch.cuda.set_device` / `synchronize` do nothing and `device_count` is the local world
size, and an nccl process group is a gloo one. Of `megatron.training.argument_utils`, only
`gpt_config_from_args` / `hybrid_config_from_args` (imported by that scaffolding; built on
`megatron.training.models`, which gigatron lacks) are stand-ins that raise, and `mock` is the
standard library's `unittest.mock` when not installed. Nothing of Megatron's is copied.
"""

from __future__ import annotations

import json
import os
import re
import sys
import types
from datetime import timedelta
from pathlib import Path

import pytest


def _stub_scaffold_imports() -> None:
    """Megatron's tests/unit_tests/test_utilities.py (imported by nearly every test) imports
    `gpt_config_from_args` / `hybrid_config_from_args` from argument_utils; they build
    `megatron.training.models` configs, which gigatron lacks. The real gigatron module is used;
    only those two names are stand-ins that raise when called."""
    import gigatron.training.argument_utils as argument_utils

    for fn in ("gpt_config_from_args", "hybrid_config_from_args"):
        if not hasattr(argument_utils, fn):
            setattr(argument_utils, fn, _not_here(fn))


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


def _cpu_distributed() -> None:
    """Megatron's `Utils` runs unchanged on gloo CPU ranks: inside its calls, `torch.cuda`'s
    set_device / synchronize do nothing and device_count is the local world size; everywhere,
    an nccl process group is a gloo one (with a finite timeout, so a lost rank fails a test),
    synchronised among its members only when created with a rank list."""
    import contextlib

    import torch
    import torch.distributed as dist
    from tests.unit_tests.test_utilities import Utils

    if torch.cuda.is_available():
        return
    timeout = timedelta(seconds=int(os.environ.get("MEGATRON_TESTS_GLOO_TIMEOUT", "60")))

    def gloo(fn):
        def call(*args, **kwargs):
            if args and isinstance(args[0], str):
                args = ("gloo" if "nccl" in args[0] else args[0], *args[1:])
            if "nccl" in str(kwargs.get("backend")):
                kwargs["backend"] = "gloo"
                if fn is new_group and kwargs.get("ranks") is not None:
                    # an NCCL group is created lazily, so Megatron's tests may create one on
                    # its members only (each rank its own DP group); gloo connects at once and
                    # needs every rank unless only the members synchronise
                    kwargs.setdefault("use_local_synchronization", True)
            if fn is init_process_group:
                kwargs.setdefault("timeout", timeout)
            return fn(*args, **kwargs)

        return call

    init_process_group, new_group = dist.init_process_group, dist.new_group
    dist.init_process_group = gloo(init_process_group)
    dist.new_group = gloo(new_group)

    @contextlib.contextmanager
    def cpu_cuda():
        saved = torch.cuda.set_device, torch.cuda.device_count, torch.cuda.synchronize
        local = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
        torch.cuda.set_device = lambda *a, **k: None
        torch.cuda.device_count = lambda: local
        torch.cuda.synchronize = lambda *a, **k: None
        try:
            yield
        finally:
            torch.cuda.set_device, torch.cuda.device_count, torch.cuda.synchronize = saved

    def on_cpu(fn):
        def call(*args, **kwargs):
            with cpu_cuda():
                return fn(*args, **kwargs)

        return staticmethod(call)

    for name in ("initialize_distributed", "destroy_model_parallel", "set_world_size"):
        setattr(Utils, name, on_cpu(getattr(Utils, name)))
    init = Utils.initialize_model_parallel
    Utils.initialize_model_parallel = staticmethod(_skip_above_world(init))


def _skip_above_world(initialize_model_parallel):
    """`Utils.initialize_model_parallel` asking for more ranks than this launch has skips the
    test ("needs more ranks"), as it would run at a world size that holds the layout."""

    def call(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, *args, **kwargs):
        tp, pp = tensor_model_parallel_size, pipeline_model_parallel_size
        cp = kwargs.get("context_parallel_size") or 1
        ep = kwargs.get("expert_model_parallel_size") or 1
        etp = kwargs.get("expert_tensor_parallel_size") or tp
        need = max(tp * pp * cp, etp * ep * pp)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if need > world:
            pytest.skip(
                f"needs more ranks: tensor {tp} x pipeline {pp} x context {cp} (expert {ep} x "
                f"expert tensor {etp}) takes {need} ranks, world size {world}"
            )
        return initialize_model_parallel(tp, pp, *args, **kwargs)

    return call


@pytest.fixture(scope="session")
def tmp_path_dist_ckpt(tmp_path_factory):
    """Megatron's conftest fixture: one directory shared by the ranks (the launcher's)."""
    shared = os.environ.get("MEGATRON_TESTS_SHARED_TMP")
    if shared:
        return Path(shared)
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


class _Results:
    """Rank 0's results as JSON lines, written as they come (the launcher reads them live)."""

    def __init__(self, path: str) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the whole session)
        self.current = None
        self.tests: dict[str, dict] = {}
        self._emit(kind="worker_start")

    def pytest_collectstart(self, collector):
        if isinstance(collector, pytest.Module):  # its import may hang: the launcher times it
            self._emit(kind="collect_start", file=collector.nodeid)

    def _emit(self, **event) -> None:
        self.out.write(json.dumps(event) + "\n")

    def pytest_collectreport(self, report):
        if report.failed:
            self._emit(kind="import_error", file=report.nodeid, message=_message(report))

    def pytest_runtest_logstart(self, nodeid, location):
        file = nodeid.split("::")[0]
        if file != self.current:
            self.current = file
            self._emit(kind="file_start", file=file)

    def pytest_runtest_logreport(self, report):
        t = self.tests.setdefault(report.nodeid, {"outcome": "passed", "message": ""})
        if report.failed:
            t.update(outcome="failed", message=_message(report))
        elif report.skipped and t["outcome"] != "failed":
            xfail = getattr(report, "wasxfail", None)
            reason = f"xfail: {xfail}" if xfail is not None else report.longrepr[2]
            t.update(outcome="skipped", message=re.sub(r"^Skipped: ", "", str(reason)))

    def pytest_runtest_logfinish(self, nodeid, location):
        self._emit(kind="test", nodeid=nodeid, **self.tests.pop(nodeid, {"outcome": "passed"}))

    def pytest_sessionfinish(self, session, exitstatus):
        self._emit(kind="session_end", exitstatus=int(exitstatus))


def _message(report) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    text = report.longreprtext
    head = crash.message if crash is not None else ""
    return (head + "\n" + text[-3000:]).strip()


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


REPO = Path(__file__).resolve().parent.parent
DEPS = REPO / ".venv-megatron-tests"  # `make megatron-test-deps`


def test_deps(opts: dict) -> Path | None:
    """The folder of Megatron's test-only packages: --deps DIR (which must exist), else
    .venv-megatron-tests when installed, else None (those tests then fail to import)."""
    if "deps" in opts:
        deps = Path(opts["deps"]).resolve()
        if not deps.is_dir():
            raise SystemExit(
                f"run_megatron_unit_tests: --deps {opts['deps']}: no such folder "
                "(pip install --target DIR -r requirements-megatron-tests.txt)"
            )
        return deps
    return DEPS if DEPS.is_dir() else None


def _setup(checkout: Path, deps: Path | None) -> None:
    os.chdir(checkout)
    sys.path.insert(0, str(checkout))
    if deps is not None:  # last: a package the running Python has wins
        sys.path.append(str(deps))
    import gigatron.compat.megatron as alias

    alias.install()
    _stub_scaffold_imports()
    _mock_package()
    _cpu_distributed()


def _options(argv: list[str]) -> tuple[dict, list[str]]:
    """This runner's options out of argv; the rest is pytest's."""
    opts, rest, i = {}, [], 0
    while i < len(argv):
        key = argv[i]
        if key in ("--nproc", "--file-timeout", "--report", "--results", "--worker", "--deps",
                   "--jobs", "--render"):  # fmt: skip
            if i + 1 >= len(argv):
                raise SystemExit(f"run_megatron_unit_tests: {key} needs a value")
            opts[key[2:].replace("-", "_")] = argv[i + 1]
            i += 2
        else:
            rest.append(key)
            i += 1
    return opts, rest


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    checkout = Path(argv[0]).resolve()
    if not (checkout / "tests" / "unit_tests").is_dir():
        print(f"{checkout}: no tests/unit_tests here (a Megatron-LM checkout?)", file=sys.stderr)
        return 2
    opts, rest = _options(argv[1:])
    deps = test_deps(opts)
    if deps is None and "worker" not in opts:
        print("run_megatron_unit_tests: no .venv-megatron-tests (`make megatron-test-deps`): "
              "test files importing msgpack, nltk, omegaconf, aiohttp or wrapt will not import",
              file=sys.stderr)  # fmt: skip
    if "render" in opts:
        from megatron_launch import render_saved

        if "report" not in opts:
            raise SystemExit("run_megatron_unit_tests: --render needs --report FILE")
        return render_saved(opts["render"].split(","), opts["report"])
    if "nproc" in opts:
        if deps is not None:
            opts["deps"] = str(deps)
        from megatron_launch import launch

        return launch(checkout, opts, rest, Path(__file__).resolve())
    args = ["--noconftest", "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
    args += ["--continue-on-collection-errors", *(rest or ["tests/unit_tests"])]
    if "worker" in opts:  # one rank under torchrun: the launcher's environment
        _setup(checkout, deps)
        plugins = [sys.modules[__name__]]
        if os.environ.get("RANK", "0") == "0":
            plugins.append(_Results(opts["worker"]))
        return int(pytest.main(args, plugins=plugins))
    _single_rank_env()
    _setup(checkout, deps)
    summary = _Summary()
    code = pytest.main(args, plugins=[summary, sys.modules[__name__]])  # + this file's fixtures
    print(f"megatron-on-gigatron: {len(summary.import_errors)} files failed to import")
    return int(code)


def _single_rank_env() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    os.environ.update(env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

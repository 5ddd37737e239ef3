"""scripts/run_megatron_unit_tests.py --nproc: Megatron-LM-style test files (a tiny stand-in
checkout, with `Utils` reading torchrun's environment and starting NCCL) run on gloo CPU ranks,
and the report counts and classifies what happened."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests._paths import REPO

pytestmark = [pytest.mark.multirank, pytest.mark.slow]

SCRIPT = REPO / "scripts" / "run_megatron_unit_tests.py"

UTILITIES = """
import os
from datetime import timedelta

import torch
from torch.distributed import rendezvous

import megatron.core.parallel_state as ps


class Utils:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    inited = False

    @staticmethod
    def initialize_distributed():
        if not torch.distributed.is_initialized():
            torch.cuda.set_device(Utils.local_rank % torch.cuda.device_count())
            url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
            store, _, _ = next(rendezvous(url, Utils.rank, Utils.world_size,
                                          timeout=timedelta(minutes=1)))
            torch.distributed.init_process_group(
                backend="nccl", world_size=Utils.world_size, rank=Utils.rank, store=store
            )
            torch.distributed.barrier()
        Utils.inited = True

    @staticmethod
    def initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=None, **kwargs,
    ):
        ps.destroy_model_parallel()
        Utils.initialize_distributed()
        ps.initialize_model_parallel(tensor_model_parallel_size, pipeline_model_parallel_size,
                                     virtual_pipeline_model_parallel_size, **kwargs)

    @staticmethod
    def set_world_size(world_size=None, rank=None):
        Utils.world_size = torch.cuda.device_count() if world_size is None else world_size

    @staticmethod
    def destroy_model_parallel():
        torch.cuda.synchronize()
        ps.destroy_model_parallel()
        Utils.inited = False
"""

FILES = {
    "test_a_ranks.py": """
        import pytest
        import torch

        import megatron.core.parallel_state as ps
        from tests.unit_tests.test_utilities import Utils


        def test_all_reduce_over_every_rank():
            Utils.initialize_distributed()
            t = torch.ones(1)
            torch.distributed.all_reduce(t)
            assert t.item() == Utils.world_size == 2
            Utils.destroy_model_parallel()


        def test_tensor_parallel_across_two_ranks():
            Utils.initialize_distributed()
            ps.initialize_model_parallel(tensor_model_parallel_size=2)
            assert ps.get_tensor_model_parallel_world_size() == 2
            Utils.destroy_model_parallel()


        @pytest.mark.skipif(Utils.world_size < 8, reason="Test requires world_size=8")
        def test_eight_ranks():
            pass
    """,
    "test_b_hangs.py": """
        import os
        import time
        from pathlib import Path


        def test_never_returns():
            Path(__file__).with_name(f"hung-{os.getpid()}.pid").write_text("")
            time.sleep(600)
    """,
    "test_ba_import_hangs.py": """
        import time

        time.sleep(600)


        def test_never_collected():
            pass
    """,
    "test_c_cuda.py": """
        import pytest
        import torch


        def test_moves_to_gpu():
            torch.zeros(1).cuda()


        @pytest.mark.skipif(not torch.cuda.is_available(), reason="Requires CUDA")
        def test_guarded():
            pass
    """,
    "test_d_missing.py": """
        from megatron.core.no_such_module import Thing


        def test_one():
            pass


        def test_two():
            pass
    """,
    "test_e_te.py": """
        import transformer_engine


        def test_te():
            pass
    """,
    "test_f_layout.py": """
        import megatron.core.parallel_state as ps
        from tests.unit_tests.test_utilities import Utils


        def test_layout_that_fits():
            Utils.initialize_model_parallel(1, 2)
            assert ps.get_pipeline_model_parallel_world_size() == 2
            Utils.destroy_model_parallel()


        def test_layout_above_the_world():
            Utils.initialize_model_parallel(2, 1, context_parallel_size=2)
            raise AssertionError("ran at 2 ranks")


        def test_ci_layout():
            open("/opt/megatron-lm/tools/preprocess_data.py").close()
    """,
    "test_g_deps.py": """
        import test_only_pkg
        import yaml


        def test_test_only_package_imports_and_loses_to_the_running_python():
            assert test_only_pkg.VALUE == 3
            assert "stand-in" not in yaml.__file__
    """,
}


@pytest.fixture
def checkout(tmp_path):
    unit = tmp_path / "Megatron-LM" / "tests" / "unit_tests"
    unit.mkdir(parents=True)
    (unit.parent / "__init__.py").write_text("")
    (unit / "__init__.py").write_text("")
    (unit / "test_utilities.py").write_text(UTILITIES)
    for name, text in FILES.items():
        (unit / name).write_text(textwrap.dedent(text))
    return unit.parent.parent


@pytest.fixture
def deps(tmp_path):
    """A stand-in .venv-megatron-tests: one package only it has, one the venv has too."""
    folder = tmp_path / "stand-in-deps"
    (folder / "test_only_pkg").mkdir(parents=True)
    (folder / "test_only_pkg" / "__init__.py").write_text("VALUE = 3\n")
    (folder / "yaml").mkdir()
    (folder / "yaml" / "__init__.py").write_text("raise ImportError('shadowed the venv')\n")
    return folder


def test_two_rank_run_counts_and_classifies(checkout, deps, tmp_path):
    report = tmp_path / "report.md"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = ["--nproc", "2", "--file-timeout", "10", "--report", str(report), "--deps", str(deps)]
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(checkout), *args],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    text = report.read_text()
    # 4 passes (two on 2 gloo ranks through Megatron's own Utils, one importing a package of
    # --deps), the CUDA test fails as "needs CUDA" and the /opt/megatron-lm one as Megatron's CI
    # layout, 3 skips (a layout of 4 ranks through Utils among them), the missing module blocks
    # one file of 2 tests, the TE file is left out by its imports, and the two hanging files
    # (one running, one importing) are stopped while the files after them still run
    assert "| 2 | 4 | 2 | 3 | 1 | 2 |" in text, text
    assert "| needs CUDA | 1 |" in text and "| needs more ranks | 2 |" in text
    assert "| needs Megatron's CI data or network | 1 |" in text and "unclassified" not in text
    assert "### needs CUDA (1)" in text and "test_c_cuda.py::test_moves_to_gpu" in text
    assert "| `megatron.core.no_such_module` | 1 | 2 |" in text
    assert "`tests/unit_tests/test_b_hangs.py`: timeout (10 s)" in text
    # a file whose import hangs is stopped alone, before any test ran: every other file still runs
    assert "`tests/unit_tests/test_ba_import_hangs.py`: timeout while collecting (10 s" in text
    assert "`tests/unit_tests/test_e_te.py`: imports `transformer_engine`" in text
    assert "CPU-runnable by their imports: 8" in text
    hung = [int(f.stem.split("-")[1]) for f in checkout.glob("tests/unit_tests/hung-*.pid")]
    assert len(hung) == 2 and not [pid for pid in hung if _alive(pid)]  # the ranks were stopped


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

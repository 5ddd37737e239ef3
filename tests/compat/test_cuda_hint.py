"""The launcher's CPU-path hint: given when a CUDA call of the script failed (read from the
traceback), never for an error that only mentions CUDA."""

import runpy
import sys

import pytest
import torch

from gigatron.compat._cuda_hint import cuda_hint

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the hint is for CPU machines")


def _hint(tmp_path, source: str) -> str | None:
    script = tmp_path / "script.py"
    script.write_text(source)
    with pytest.raises(Exception) as info:
        runpy.run_path(str(script), run_name="__main__")
    return cuda_hint(str(script), info.value)


def test_rng_tracker_without_the_seed_call_gets_no_cuda_hint(tmp_path):
    from gigatron.core.tensor_parallel import get_cuda_rng_tracker

    get_cuda_rng_tracker().reset()  # an earlier test of this process may have seeded it
    source = (
        "from gigatron.core.tensor_parallel import get_cuda_rng_tracker\n"
        "with get_cuda_rng_tracker().fork():\n"
        "    pass\n"
    )
    assert _hint(tmp_path, source) is None


def test_error_naming_torch_cuda_amp_gets_no_cuda_hint(tmp_path):
    source = "from gigatron.compat.loss_reports import LossReports\nLossReports([]).backward()\n"
    assert _hint(tmp_path, source) is None


def test_world_size_from_device_count_alone_does_not_blame_cuda(tmp_path):
    source = "import torch\nworld = torch.cuda.device_count()\nraise ValueError('my own mistake')\n"
    assert _hint(tmp_path, source) is None


def test_failed_cuda_call_is_named_with_every_cuda_line_of_the_script(tmp_path):
    source = (
        "import torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "model.cuda()\n"
        "x = torch.ones(2, device='cuda')\n"
        "torch.distributed.init_process_group('nccl')\n"
    )
    hint = _hint(tmp_path, source)
    assert hint is not None and "no CUDA device" in hint and "stopped at line 3" in hint, hint
    for line in ("line 3: model.cuda()", "line 4: x = torch.ones", "line 5: torch.distributed"):
        assert line in hint, (line, hint)


def test_cuda_failure_raised_in_c_is_named(tmp_path):
    source = "import torch\n\ng = torch.Generator(device='cuda')\n"
    hint = _hint(tmp_path, source)
    assert hint is not None and "stopped at line 3" in hint, hint


def test_wrong_argument_inside_torch_cuda_gets_no_cuda_hint(tmp_path):
    source = "import torch\nwith torch.cuda.amp.autocast(dtype='bfloat16'):\n    pass\n"
    with pytest.warns(UserWarning):  # autocast says CUDA is off before the TypeError
        assert _hint(tmp_path, source) is None


def test_nccl_in_a_helper_module_of_the_user_is_named(tmp_path):
    (tmp_path / "helper_nccl.py").write_text(
        "import torch.distributed as dist\n"
        "def setup():\n"
        "    dist.init_process_group('nccl', store=dist.HashStore(), rank=0, world_size=1)\n"
    )
    source = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
        "from helper_nccl import setup\nsetup()\n"
    )
    try:
        hint = _hint(tmp_path, source)
    finally:
        sys.modules.pop("helper_nccl", None)
    assert hint is not None and "helper_nccl.py line 3" in hint, hint

"""The same parity runs as test_pipeline_schedules.py over NCCL, one GPU per rank (skipped
without 2 GPUs): 1F1B and interleaved schedules, deallocation, variable sequence lengths."""

import pytest
import torch

from gigatron.testing import run_distributed
from tests.core.pipeline_parallel.test_schedules import _assert_parity, _parity_cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
    pytest.mark.multirank,
]


@pytest.mark.timeout(300)
def test_pp2_schedules_over_nccl():
    cuda = {"device": "cuda"}
    cases = [
        (None, 4, True, dict(cuda)),
        (None, 8, False, {**cuda, "deallocate_pipeline_outputs": True}),
        (None, 4, True, {**cuda, "variable_seq_lengths": True, "varlen": True}),
        (None, 1, True, {**cuda, "variable_seq_lengths": True, "varlen": True}),
        (2, 4, True, dict(cuda)),
        (2, 8, True, {**cuda, "deallocate_pipeline_outputs": True}),
        (2, 2, False, {**cuda, "variable_seq_lengths": True, "varlen": True}),
    ]
    _assert_parity(run_distributed(_parity_cases, 2, args=(2, cases), backend="nccl", timeout=240))

import os
import sys

import pytest
import torch

from tests._paths import MEGATRON_ORACLE, put_oracle_first

# megatron-core, the parity oracle, lives outside the venv (`make oracle`, requirements-oracle.txt):
# first on sys.path (ahead of a megatron-core an older .venv may hold) for this session only.
# Spawned ranks inherit sys.path; a test that starts a fresh interpreter and needs the oracle
# passes its env through `tests._paths.with_oracle`.
if MEGATRON_ORACLE.is_dir():
    put_oracle_first(sys.path)
elif os.environ.get("MEGATRON_ORACLE"):
    raise pytest.UsageError(f"MEGATRON_ORACLE={MEGATRON_ORACLE} is no folder (`make oracle`)")

# At most 2 torch threads (the CI machine has 2 cores). Under pytest-xdist (`make test` runs
# 2 workers) one thread per worker, and one for the processes it starts (gigatron train,
# torchrun, examples read OMP_NUM_THREADS), so workers and their ranks do not oversubscribe the
# cores. (Ranks of run_distributed set 1 thread themselves.)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # this worker process and its children only
    torch.set_num_threads(1)
else:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        # the marker, not `item.keywords` (which also holds file and folder names): a CPU case
        # in a CUDA test file runs
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)

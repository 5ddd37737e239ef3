import os

import pytest
import torch

# Single-threaded torch keeps spawned-rank tests from oversubscribing the 2 CI cores.
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

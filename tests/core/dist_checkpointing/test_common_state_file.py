"""strategies.common: `save_common` / `load_common` write and read a checkpoint's `common.pt`
(Megatron's names, deprecated in 0.20, used by its conversion tools); the file is read
restricted, and a missing or crafted one is a clear error."""

import argparse
import os
import pickle

import pytest

from gigatron.core.dist_checkpointing.core import CheckpointingException
from gigatron.core.dist_checkpointing.strategies.common import (
    COMMON_STATE_FNAME,
    load_common,
    save_common,
)


class _Runs:
    def __reduce__(self):
        return (os.system, ("echo crafted",))


def test_saved_common_state_loads_back(tmp_path):
    state = {"iteration": 7, "args": argparse.Namespace(lr=0.5), "rng": [1, 2]}
    save_common(state, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [COMMON_STATE_FNAME]  # no temporary file left
    loaded = load_common(str(tmp_path))
    assert loaded["iteration"] == 7 and loaded["args"].lr == 0.5 and loaded["rng"] == [1, 2]


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(CheckpointingException, match="common.pt does not exist"):
        load_common(str(tmp_path))


def test_a_crafted_file_runs_no_code(tmp_path):
    (tmp_path / COMMON_STATE_FNAME).write_bytes(pickle.dumps({"x": _Runs()}))
    with pytest.raises(CheckpointingException):
        load_common(str(tmp_path))

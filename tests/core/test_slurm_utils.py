"""megatron.core._slurm_utils: srun's task variables, None outside SLURM."""

import pytest

from gigatron.core._slurm_utils import (
    is_slurm_job,
    resolve_slurm_local_rank,
    resolve_slurm_rank,
    resolve_slurm_world_size,
)

SLURM = ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


@pytest.fixture
def env(monkeypatch):
    for key in SLURM:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_outside_slurm_everything_is_none(env):
    env.setenv("SLURM_PROCID", "3")  # without SLURM_NTASKS this is no SLURM job
    assert is_slurm_job() is False
    assert resolve_slurm_rank() is resolve_slurm_world_size() is resolve_slurm_local_rank() is None


def test_a_slurm_task_reads_its_rank_size_and_local_rank(env):
    env.setenv("SLURM_NTASKS", "16")
    env.setenv("SLURM_PROCID", "5")
    env.setenv("SLURM_LOCALID", "1")
    assert is_slurm_job() is True
    assert (resolve_slurm_rank(), resolve_slurm_world_size(), resolve_slurm_local_rank()) == (
        5, 16, 1,
    )  # fmt: skip


def test_a_variable_srun_left_unset_is_none(env):
    env.setenv("SLURM_NTASKS", "8")
    assert resolve_slurm_world_size() == 8
    assert resolve_slurm_rank() is None and resolve_slurm_local_rank() is None


def test_a_non_integer_is_a_value_error_naming_it(env):
    env.setenv("SLURM_NTASKS", "8")
    env.setenv("SLURM_PROCID", "x")
    with pytest.raises(ValueError, match="SLURM_PROCID='x'"):
        resolve_slurm_rank()

"""gigatron.training.determinism: env validation and defaults, the --deterministic-mode check."""

import os
from types import SimpleNamespace

import pytest
import torch

from gigatron.training import determinism as det


def test_defaults_fill_only_unset_variables():
    env = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    det.apply_determinism_env(env)
    assert env == {
        "CUBLAS_WORKSPACE_CONFIG": ":16:8",
        "NCCL_ALGO": "Ring",
        "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
    }


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_ALGO": "Ring,NVLS"},
        {"NCCL_ALGO": " , "},
        {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1"},
        {"CUBLAS_WORKSPACE_CONFIG": ":8:8"},
        {"MAMBA_DETERMINISTIC": "0"},
    ],
)
def test_nondeterministic_settings_rejected_by_name(env):
    name = next(iter(env))
    with pytest.raises(ValueError, match=name):
        det.apply_determinism_env(dict(env))


def test_accepted_settings_pass():
    env = {
        "NCCL_ALGO": "^NVLS, Ring",
        "CAUSAL_CONV1D_DETERMINISTIC": "1",
        "MAMBA_DETERMINISTIC": "",
    }
    det.apply_determinism_env(env)
    assert env["NCCL_ALGO"] == "^NVLS, Ring"


def test_args_check_then_torch_switch(monkeypatch):
    for name in det.DETERMINISM_ENV_VAR_DEFAULTS:  # setenv first: undo then restores "unset"
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    bad = SimpleNamespace(cross_entropy_loss_fusion=True, tp_comm_overlap=False)
    with pytest.raises(ValueError, match="cross_entropy_loss_fusion=False"):
        det.apply_determinism_to_args(bad)
    was = torch.are_deterministic_algorithms_enabled()
    try:
        det.apply_determinism_to_args(
            SimpleNamespace(cross_entropy_loss_fusion=False, tp_comm_overlap=False)
        )
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(was)
    assert os.environ["NCCL_ALGO"] == "Ring"

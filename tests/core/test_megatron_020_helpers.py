"""Megatron 0.20's small helpers: rank discovery, one-rank logging, experimental decorators,
the per-layer FP8 context, HAVE_TE, and the CP split of position embeddings."""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from gigatron.core import _rank_utils, config
from gigatron.core import utils as core_utils
from gigatron.core.fp8_utils import get_fp8_context
from gigatron.core.models.common.embeddings.rope_utils import get_pos_emb_on_this_cp_rank
from gigatron.core.tensor_parallel import random as tp_random


def test_safe_rank_and_world_size_fall_back_to_launcher_variables(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert (_rank_utils.safe_get_rank(), _rank_utils.safe_get_world_size()) == (5, 8)
    monkeypatch.setenv("RANK", "3")  # torchrun's variables win
    assert _rank_utils.safe_get_rank() == 3
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("SLURM_PROCID")
    with pytest.warns(UserWarning, match="rank"):
        assert _rank_utils.safe_get_rank() == 0
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x'"):
        _rank_utils.safe_get_rank()


def test_log_single_rank_logs_on_the_named_rank_only():
    logger = mock.Mock(spec=logging.Logger)
    logger.isEnabledFor.return_value = True
    with mock.patch.object(_rank_utils, "safe_get_rank", return_value=2):
        _rank_utils.log_single_rank(logger, logging.INFO, "a %s", 1, rank=2, extra={"k": 1})
        _rank_utils.log_single_rank(logger, logging.INFO, "b")
    logger.log.assert_called_once_with(logging.INFO, "a %s", 1, extra={"k": 1})
    assert core_utils.log_single_rank is _rank_utils.log_single_rank


def test_log_on_each_pipeline_stage_checks_then_logs_on_stage_leaders():
    logger = mock.Mock(spec=logging.Logger)
    logger.isEnabledFor.return_value = True
    tp, dp = mock.Mock(), mock.Mock()
    with pytest.raises(AssertionError, match="torch.distributed"):
        core_utils.log_on_each_pipeline_stage(logger, logging.INFO, "m")
    with mock.patch.object(torch.distributed, "is_initialized", return_value=True):
        with pytest.raises(ValueError, match="together"):
            core_utils.log_on_each_pipeline_stage(logger, logging.INFO, "m", tp_group=tp)
        tp.rank.return_value, dp.rank.return_value = 0, 1
        core_utils.log_on_each_pipeline_stage(logger, 20, "m", tp_group=tp, dp_cp_group=dp)
        logger.log.assert_not_called()
        dp.rank.return_value = 0
        core_utils.log_on_each_pipeline_stage(logger, 20, "m %d", 7, tp_group=tp, dp_cp_group=dp)
    logger.log.assert_called_once_with(20, "m %d", 7)


@core_utils.experimental_cls(introduced_with_version="0.1.0")
class _Exp:
    def method(self):
        return "ok"

    @classmethod
    def cmethod(cls):
        return "ok"


@core_utils.experimental_fn(introduced_with_version="0.1.0")
def _exp_fn(x):
    return x + 1


def test_experimental_decorators_follow_the_flag():
    with mock.patch.object(config, "ENABLE_EXPERIMENTAL", False):
        assert _Exp.is_experimental is False
        for call in (_Exp, lambda: _Exp.cmethod(), lambda: _exp_fn(1)):
            with pytest.raises(core_utils.ExperimentalNotEnabledError):
                call()
    with mock.patch.object(config, "ENABLE_EXPERIMENTAL", True):
        obj = _Exp()
        assert obj.method() == "ok" and _Exp.cmethod() == "ok" and _exp_fn(1) == 2
        assert obj.is_experimental is True and _Exp.__qualname__.endswith("_Exp")
        assert type(obj).__qualname__ == _Exp.__qualname__
    with pytest.raises(core_utils.ExperimentalNotEnabledError):
        obj.method()  # instances are guarded too


def test_fp8_context_is_a_no_op_and_have_te_is_false():
    config_ = SimpleNamespace(fp8="e4m3", fp8_param=False)
    assert isinstance(get_fp8_context(config_, layer_no=0), contextlib.nullcontext)
    assert tp_random.HAVE_TE is False


def test_pos_emb_on_this_cp_rank_takes_the_zigzag_chunks():
    pos = torch.arange(8).view(8, 1)
    group = mock.Mock(size=mock.Mock(return_value=2), rank=mock.Mock(return_value=1))
    assert get_pos_emb_on_this_cp_rank(pos, 0, group).flatten().tolist() == [2, 3, 4, 5]
    group.rank.return_value = 0
    assert get_pos_emb_on_this_cp_rank(pos, 0, group).flatten().tolist() == [0, 1, 6, 7]
    with pytest.raises(ValueError, match="cp_group"):
        get_pos_emb_on_this_cp_rank(pos, 0, None)
    with pytest.raises(ValueError, match="divisible"):
        get_pos_emb_on_this_cp_rank(torch.arange(6), 0, group)

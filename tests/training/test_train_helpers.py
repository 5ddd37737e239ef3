"""megatron.training.training helpers: sample counts per split, --freeze-all-layers, and the
packed-sequence length statistics behind the FLOP count."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

from gigatron.training import global_vars
from gigatron.training import training as tr


def _args(**kw):
    base = dict(
        iteration=0, train_samples=None, train_iters=100, eval_interval=10, eval_iters=5,
        global_batch_size=32, eval_global_batch_size=None, skip_train=False,
        start_eval_at_iter=None, full_validation=False, phase_transition_iterations=None,
    )  # fmt: skip
    return SimpleNamespace(**(base | kw))


@pytest.fixture
def set_args(monkeypatch):
    def put(args):
        monkeypatch.setattr(global_vars, "_ARGS", args)

    return put


def test_num_samples_periodic_and_final_evaluations(set_args):
    set_args(_args())
    assert tr.get_train_valid_test_num_samples() == (3200, 11 * 5 * 32, 5 * 32)
    set_args(_args(eval_global_batch_size=16))
    assert tr.get_train_valid_test_num_samples() == (3200, 11 * 5 * 16, 5 * 16)
    # the 4 evaluations before iteration 50 skipped (Megatron's count skips 5, one too many)
    set_args(_args(start_eval_at_iter=50))
    assert tr.get_train_valid_test_num_samples()[1] == 7 * 5 * 32


def test_num_samples_skip_train_full_validation_and_phases(set_args):
    set_args(_args(skip_train=True))
    assert tr.get_train_valid_test_num_samples()[1] == 5 * 32
    set_args(_args(full_validation=True))
    assert tr.get_train_valid_test_num_samples()[1] is None
    set_args(_args(train_samples=6400, phase_transition_iterations=[50], iteration=60))
    assert tr.get_train_valid_test_num_samples()[0] == 6400 - 50 * 32


def test_freeze_all_model_chunks_freezes_params_and_expert_bias():
    chunk = torch.nn.Sequential(torch.nn.Linear(2, 2))
    chunk[0].frozen_expert_bias = False
    assert tr._freeze_all_model_chunks([chunk])[0] is chunk
    assert not any(p.requires_grad for p in chunk.parameters())
    assert chunk[0].frozen_expert_bias is True


def test_grad_context_follows_freeze_flag():
    ctx, forward_only = tr._forward_backward_grad_context(SimpleNamespace(freeze_all_layers=True))
    with ctx:
        x = torch.ones(2, requires_grad=True) * 2
    assert forward_only is True and x.grad_fn is None
    ctx, forward_only = tr._forward_backward_grad_context(SimpleNamespace())
    assert isinstance(ctx, contextlib.nullcontext) and forward_only is False


@pytest.fixture
def fresh_stats(monkeypatch):
    monkeypatch.setattr(tr, "_seqlen_stats_in_iteration", None)
    monkeypatch.setattr(tr, "_seqlen_stats_active", False)


def test_seqlen_stats_accumulate_and_reset(fresh_stats):
    tr.update_seqlen_stats_from_cu_seqlens(torch.tensor([0, 3, 7], dtype=torch.int32))
    tr.update_seqlen_stats_from_cu_seqlens(torch.tensor([0, 5], dtype=torch.int32))
    assert tr.consume_seqlen_stats_in_iteration() == (12.0, 9 + 16 + 25)
    assert tr.consume_seqlen_stats_in_iteration() == (None, None)


def test_seqlen_stats_ignore_empty_input(fresh_stats):
    tr.update_seqlen_stats_from_cu_seqlens(None)
    tr.update_seqlen_stats_from_cu_seqlens(torch.tensor([0]))
    assert tr._seqlen_stats_active is False and tr._seqlen_stats_in_iteration is None
    assert tr.consume_seqlen_stats_in_iteration() == (None, None)

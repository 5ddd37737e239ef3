"""Saved optimizer param groups are matched to the current ones by identifier (the
ParamGroupOverride fields + structural flags), not by position; HAVE_EMERGING_OPTIMIZERS is
True (gigatron carries its own Muon and Lion)."""

import pytest

from gigatron.core.optimizer import HAVE_EMERGING_OPTIMIZERS
from gigatron.core.optimizer.optimizer import MegatronOptimizer, param_group_identifier_keys
from gigatron.core.optimizer_param_scheduler import ParamGroupOverride


def _group(**kw):
    return {"params": [], "lr_mult": 1.0, "is_expert_parallel": False, **kw}


def test_identifier_has_every_override_field_and_no_per_step_key():
    assert set(ParamGroupOverride.__annotations__) <= set(param_group_identifier_keys)
    assert {"lr_mult", "is_expert_parallel", "is_decoupled_lr"} <= set(param_group_identifier_keys)
    assert not {"lr", "weight_decay", "step"} & set(param_group_identifier_keys)


def test_groups_differing_only_by_max_lr_are_matched_by_it():
    current = [_group(max_lr=1.0), _group(max_lr=2.0)]
    saved = [_group(max_lr=2.0, tag="b", params=[0]), _group(max_lr=1.0, tag="a", params=[1])]
    out = MegatronOptimizer._filter_and_reorder_param_groups(current, saved)
    assert [g["tag"] for g in out] == ["a", "b"]
    assert [g["params"] for g in out] == [[0], [1]]  # params keep the saved positions


def test_missing_key_equals_none_and_unknown_group_is_refused():
    out = MegatronOptimizer._filter_and_reorder_param_groups([_group()], [_group(min_lr=None)])
    assert len(out) == 1
    with pytest.raises(ValueError, match="no saved param group has identifier"):
        MegatronOptimizer._filter_and_reorder_param_groups([_group(max_lr=3.0)], [_group()])


def test_emerging_optimizers_are_present():
    assert HAVE_EMERGING_OPTIMIZERS is True

"""`dist_checkpointing.optimizer` helpers for a plain torch.optim state dict: optimizer ids map
to the model's ShardedTensors by tensor identity, each Adam moment becomes a ShardedTensor laid
out like its param, and a save / load round trip gives the moments back."""

import pytest
import torch

from gigatron.core import dist_checkpointing as dc
from gigatron.core.dist_checkpointing import ShardedTensor
from gigatron.core.dist_checkpointing.mapping import LocalNonpersistentObject
from gigatron.core.dist_checkpointing.optimizer import (
    get_param_id_to_sharded_param_map,
    optim_state_to_sharding_state,
)


def _model_and_adam():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return model, opt


def _sharded(model):
    # keep_vars: the ShardedTensors hold the params themselves (identity is the match).
    params = model.state_dict(keep_vars=True)
    return {k: ShardedTensor.from_rank_offsets(k, v) for k, v in params.items()}


def test_ids_match_params_and_moments_round_trip(tmp_path):
    model, opt = _model_and_adam()
    id_map = get_param_id_to_sharded_param_map(_sharded(model), model.parameters())
    assert {i: t.key for i, t in id_map.items()} == {0: "weight", 1: "bias"}
    state = opt.state_dict()
    expected = {i: s["exp_avg_sq"].clone() for i, s in state["state"].items()}
    optim_state_to_sharding_state(state, id_map, exclude_keys=("step",))
    moment = state["state"][0]["exp_avg_sq"]
    assert moment.key == "optimizer.state.exp_avg_sq.weight" and moment.global_shape == (3, 4)
    assert "step" not in state["state"][0]
    assert isinstance(state["param_groups"][0]["params"], LocalNonpersistentObject)
    dc.save({"optimizer": state}, str(tmp_path))

    model2, opt2 = _model_and_adam()
    request = opt2.state_dict()
    for s in request["state"].values():
        for name in ("exp_avg", "exp_avg_sq"):
            s[name] = torch.zeros_like(s[name])
    optim_state_to_sharding_state(
        request, get_param_id_to_sharded_param_map(_sharded(model2), model2.parameters()),
        exclude_keys=("step",),
    )  # fmt: skip
    loaded = dc.load({"optimizer": request}, str(tmp_path))
    for i, value in expected.items():
        torch.testing.assert_close(loaded["optimizer"]["state"][i]["exp_avg_sq"], value)


def test_unknown_param_id_and_shape_mismatch_raise():
    model, opt = _model_and_adam()
    with pytest.raises(ValueError, match="param id 1"):
        optim_state_to_sharding_state(
            opt.state_dict(), {0: _sharded(model)["weight"]}, exclude_keys=("step",)
        )
    state = opt.state_dict()
    wrong = {0: _sharded(model)["bias"], 1: _sharded(model)["weight"]}
    with pytest.raises(dc.core.CheckpointingException, match="optimizer tensor shape"):
        optim_state_to_sharding_state(state, wrong, exclude_keys=("step",))

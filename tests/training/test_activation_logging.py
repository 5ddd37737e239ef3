"""gigatron.training.activation_logging: activation hooks, tokens-per-expert records, and the
files `save_activations` / `save_tpe` write (through checkpointing.save_grads)."""

import json

import torch
import torch.nn as nn

from gigatron.training.activation_logging import ActivationLogger
from tests._one_rank import one_rank_fixtures

gloo_world, single_rank = one_rank_fixtures(cuda_seed=None)


def test_activation_hooks_capture_and_save(tmp_path):
    model = [nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))]
    log = ActivationLogger(str(tmp_path))
    log.register_activation_hooks(model)
    assert len(log._activation_hooks) == 2  # the ReLU is not linear-like
    x = torch.randn(5, 4)
    y = model[0](x)
    log.remove_activation_hooks()
    model[0](x)  # no hooks left: nothing new recorded
    saved = log._activations_state_dict["model_chunk0"]
    assert sorted(saved) == ["0/input0", "0/output0", "2/input0", "2/output0"]
    assert torch.equal(saved["0/input0"], x) and torch.equal(saved["2/output0"], y.detach())
    log.save_activations(iteration=7)
    loaded = torch.load(tmp_path / "activations" / "iter_0000007" / "mp_rank_00.pth")
    assert torch.equal(loaded["model_chunk0"]["0/input0"], x)
    assert not log._activations_state_dict


def test_tpe_hook_records_and_jsonl(tmp_path, caplog):
    log = ActivationLogger(str(tmp_path))
    assert log._make_tpe_hook("c", "decoder.layers.x.mlp") is None
    assert "Cannot extract layer number" in caplog.text
    dec = log._make_tpe_hook("c", "decoder.layers.2.mlp.experts.linear_fc1")
    mtp = log._make_tpe_hook("c", "mtp.layers.1.mtp_model_layer.layers.0.mlp.experts.linear_fc1")
    dec(None, (torch.zeros(1), [3, 1]), {}, None)
    dec(None, (torch.zeros(1), torch.tensor([9])), {}, None)  # a tensor is not a count list
    mtp(None, (torch.zeros(1), (2, 2)), {}, None)
    log.save_tpe(iteration=5)
    log.save_tpe(iteration=6)  # nothing recorded since: no line
    lines = (tmp_path / "tokens_per_expert" / "rank0.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"iter": 5, "block": "decoder", "layer": 2, "tpe": [[3, 1]]},
        {"iter": 5, "block": "mtp", "mtp_idx": 1, "layer": 0, "tpe": [[2, 2]]},
    ]

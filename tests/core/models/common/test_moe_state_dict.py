"""localize_experts keeps one EP rank's experts of a full state dict, renumbered from 0."""

import torch

from gigatron.core.models.common.moe_state_dict import localize_experts


def test_localize_experts_keeps_this_ranks_experts():
    sd = {
        f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc1.weight": torch.full((1,), e)
        for e in range(4)
    }
    sd["decoder.layers.0.mlp.router.weight"] = torch.zeros(1)
    local = localize_experts(sd, 4, 2, 1)
    assert local["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"].item() == 2
    assert local["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"].item() == 3
    assert len(local) == 3

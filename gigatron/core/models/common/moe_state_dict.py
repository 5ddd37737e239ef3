"""Move full (TP = EP = 1) MoE weights into an expert-parallel model: this rank's experts.

The MoE counterpart of tp_state_dict: expert e lives on EP rank e // (num_experts / ep_size),
renumbered from 0 there; expert weights are split over expert TP, the rest over TP; GroupedMLP's
`weight1` [h, E * glu * f] / `weight2` [E * f, h] are cut per rank the same way.
gigatron-specific helpers (used by tests).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core import parallel_state as ps
from gigatron.core.models.common.tp_state_dict import shard_for_rank


def localize_experts(sd: dict[str, Tensor], num_experts: int, ep_size: int, ep_rank: int) -> dict:
    """Keep EP rank `ep_rank`'s experts of a full SequentialMLP-layout state dict, renumbered
    from 0 (expert e lives on rank e // (num_experts / ep_size))."""
    if num_experts % ep_size:
        raise ValueError(f"num_experts ({num_experts}) must be divisible by ep_size ({ep_size})")
    n_local = num_experts // ep_size
    out = {}
    for key, value in sd.items():
        if ".local_experts." not in key:
            out[key] = value
            continue
        head, rest = key.split(".local_experts.", 1)
        e, tail = rest.split(".", 1)
        if int(e) // n_local == ep_rank:
            out[f"{head}.local_experts.{int(e) % n_local}.{tail}"] = value
    return out


def _expert_shard(full: Tensor, name: str, config, ep: tuple[int, int], etp: tuple[int, int]):
    """This rank's piece of a full (EP = ETP = 1) GroupedMLP weight1 / weight2."""
    (ep_rank, ep_size), (etp_rank, etp_size) = ep, etp
    num_experts = config.num_moe_experts
    n_local, h = num_experts // ep_size, config.hidden_size
    first = ep_rank * n_local
    if name.endswith("weight1"):  # [h, E*glu*f] viewed [E, h, glu*f]; GLU shard = [gate_r; up_r]
        stride = 2 if config.gated_linear_unit else 1
        local = full.reshape(num_experts, h, -1)[first : first + n_local]
        parts = torch.chunk(local, etp_size * stride, dim=2)
        return torch.cat(parts[etp_rank::etp_size], dim=2).reshape(h, -1)
    local = full.reshape(num_experts, -1, h)[first : first + n_local]  # weight2 [E, f, h]
    return torch.chunk(local, etp_size, dim=1)[etp_rank].reshape(-1, h)


def load_full_moe_state_dict(model, full_sd: dict[str, Tensor]) -> None:
    """`tp_state_dict.load_full_state_dict` for MoE models at any TP x EP x ETP layout.

    `full_sd` is a full (TP = EP = ETP = 1) state dict in the model's expert layout: experts
    are cut to this EP rank's and split over expert TP, the rest
    over TP. With `state_dict()` of an EP = 1 model it reshards to any EP size (strict keys).
    """
    config = model.config
    tp = (ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
    ep = (ps.get_expert_model_parallel_rank(), ps.get_expert_model_parallel_world_size())
    etp = (ps.get_expert_tensor_parallel_rank(), ps.get_expert_tensor_parallel_world_size())
    n_local = config.num_moe_experts // ep[1]
    wanted = {}
    for name, param in model.named_parameters():
        key = name
        if ".local_experts." in name:
            head, rest = name.split(".local_experts.", 1)
            i, tail = rest.split(".", 1)
            key = f"{head}.local_experts.{ep[0] * n_local + int(i)}.{tail}"
        wanted[key] = (name, param)
    for e in range(config.num_moe_experts):  # other EP ranks' experts are expected, not loaded
        for key in [k for k in full_sd if f".local_experts.{e}." in k]:
            wanted.setdefault(key, None)
    missing = sorted(set(wanted) - set(full_sd))
    unexpected = sorted(set(full_sd) - set(wanted))
    if missing or unexpected:
        raise ValueError(f"load_full_moe_state_dict: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for key, entry in wanted.items():
            if entry is None:
                continue
            name, param = entry
            full = full_sd[key]
            if name.endswith(("experts.weight1", "experts.weight2")):
                shard = _expert_shard(full, name, config, ep, etp)
            elif ".local_experts." in name:
                shard = shard_for_rank(full, param, *etp)
            else:
                shard = shard_for_rank(full, param, *tp)
            if shard.shape != param.shape:
                raise ValueError(
                    f"load_full_moe_state_dict: {name} shard {tuple(shard.shape)} does not match "
                    f"parameter {tuple(param.shape)} (full {tuple(full.shape)})"
                )
            param.copy_(shard)

"""Matching saved optimizer param groups to the current ones by what they are, not by position
(construction order is not part of a checkpoint); mirrors Megatron's
`optimizer.param_group_identifier_keys` and `MegatronOptimizer._filter_and_reorder_param_groups`.

A group's identifier is the tuple of its values for `param_group_identifier_keys`: every
per-group override the scheduler reads (`ParamGroupOverride`'s fields) plus the structural flags
set when the groups are built. Keys rewritten each step (`lr`, `weight_decay`, `step`) are not
part of it, so a group saved at step N matches the freshly built one.
"""

from __future__ import annotations

from gigatron.core.optimizer_param_scheduler import ParamGroupOverride


def _param_group_override_keys() -> tuple[str, ...]:
    """Every field declared on ParamGroupOverride (whatever its totality), sorted."""
    return tuple(sorted(ParamGroupOverride.__annotations__))


param_group_identifier_keys = (
    *_param_group_override_keys(),
    "lr_mult",
    "is_expert_parallel",
    "is_decoupled_lr",
)


def _identifier(group: dict) -> tuple:
    """The group's values for the identifier keys; a missing key and None are the same, and
    NeMo's `pre_<key>` aliases count as `<key>`."""
    return tuple(group.get(k, group.get(f"pre_{k}")) for k in param_group_identifier_keys)


def filter_and_reorder_param_groups(current_groups: list, state_dict_groups: list) -> list:
    """For each current group (in order), the saved group with the same identifier, holding the
    `params` of the saved group at the same position. Raises ValueError naming the identifier
    when a current group has no saved counterpart."""
    saved = {_identifier(g): g for g in state_dict_groups}
    saved_params = [g["params"] for g in state_dict_groups]  # before any group is rewritten
    out = []
    for group, params in zip(current_groups, saved_params):
        key = _identifier(group)
        if key not in saved:
            raise ValueError(
                f"optimizer state: no saved param group has identifier {key} "
                f"(keys {param_group_identifier_keys}); saved identifiers: {sorted(saved, key=str)}"
            )
        match = saved[key]
        match["params"] = params
        out.append(match)
    return out

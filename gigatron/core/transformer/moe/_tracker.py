"""Per-layer MoE aux-loss tracking for logging (re-exported by `moe_utils`).

Mirrors the tracker half of `megatron.core.transformer.moe.moe_utils`: routers add each aux loss
(divided by its coefficient) to `tracker[name]["values"][layer_number - 1]` during forward;
`track_moe_metrics` reduces the values over PP (sum), the loss's reduce group (sum) and DP
(average), writes the mean over MoE layers into `total_loss_dict` / a writer, and clears them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_MOE_LAYER_WISE_LOGGING_TRACKER: dict = {}


def get_moe_layer_wise_logging_tracker() -> dict:
    """The process-wide {loss name: {"values": [num_layers], "reduce_group", ...}} dict."""
    return _MOE_LAYER_WISE_LOGGING_TRACKER


def save_to_aux_losses_tracker(
    name: str,
    loss: torch.Tensor,
    layer_number: int | None,
    num_layers: int,
    reduce_group=None,
    avg_group=None,
    reduce_group_has_dp: bool = False,
) -> None:
    """Add `loss` (detached) to layer `layer_number` (1-based) of tracker entry `name`.

    `layer_number` may be a 0-d int tensor (the router's `layer_number_tensor`; 0 = unset, adds
    nothing): a compiled layer then files its loss with tensor ops, and every layer's graph is
    the same."""
    if layer_number is None:
        return
    tracker = get_moe_layer_wise_logging_tracker()
    if name not in tracker or tracker[name]["values"].device != loss.device:
        tracker[name] = {"values": torch.zeros(num_layers, device=loss.device)}
    values = tracker[name]["values"]
    if torch.is_tensor(layer_number):
        rows = torch.arange(values.shape[0], device=values.device)
        hit = rows == (layer_number.to(values.device) - 1)
        values.add_(torch.where(hit, loss.detach().float().to(values.device), 0.0))
    else:
        values[layer_number - 1] += loss.detach().float()
    tracker[name]["reduce_group"] = reduce_group
    tracker[name]["avg_group"] = avg_group
    tracker[name]["reduce_group_has_dp"] = reduce_group_has_dp


def prepare_aux_losses_tracker(names, num_layers: int, device) -> None:
    """Create the entries `names` (zeros [num_layers] on `device`) that do not exist yet. MoE
    layers call it when built: a compiled layer that created an entry itself would be compiled
    again once the entry exists (dynamo guards on the dict's keys)."""
    tracker = get_moe_layer_wise_logging_tracker()
    for name in names:
        if name not in tracker:
            tracker[name] = {
                "values": torch.zeros(num_layers, device=device),
                "reduce_group": None,
                "avg_group": None,
                "reduce_group_has_dp": False,
            }


def clear_aux_losses_tracker() -> None:
    """Zero every tracked value (after logging)."""
    for entry in get_moe_layer_wise_logging_tracker().values():
        entry["values"].zero_()


def reduce_aux_losses_tracker_across_ranks(track_names=None, pg_collection=None) -> None:
    """Sum the values over PP and each loss's reduce group; average over DP."""
    tracker = get_moe_layer_wise_logging_tracker()
    if not dist.is_initialized():
        return
    if pg_collection is None:
        from gigatron.core import parallel_state

        pp_group = parallel_state.get_pipeline_model_parallel_group()
        dp_group = parallel_state.get_data_parallel_group()
    else:
        pp_group, dp_group = pg_collection.pp, pg_collection.dp
    for name in tracker if track_names is None else track_names:
        entry = tracker[name]
        values = entry["values"]
        dist.all_reduce(values, group=pp_group)
        if entry.get("reduce_group") is not None:
            dist.all_reduce(values, group=entry["reduce_group"])
            if not entry.get("reduce_group_has_dp", False):
                values.div_(dist.get_world_size(dp_group))
                dist.all_reduce(values, group=dp_group)
        if entry.get("avg_group") is not None:
            values.div_(dist.get_world_size(entry["avg_group"]))
            dist.all_reduce(values, group=entry["avg_group"])


def track_moe_metrics(
    loss_scale: float,
    iteration: int,
    writer=None,
    wandb_writer=None,
    total_loss_dict: dict | None = None,
    per_layer_logging: bool = False,
    force_initialize: bool = False,
    track_names: list[str] | None = None,
    num_layers: int | None = None,
    moe_layer_freq=None,
    mtp_num_layers: int | None = None,
    pg_collection=None,
) -> dict:
    """Reduce, log and clear the tracked aux losses.

    Each loss is reported as `sum over layers / number of MoE layers * loss_scale` into
    `total_loss_dict[name]` (accumulated), `writer.add_scalar(name, ...)` and, with
    `per_layer_logging`, `moe/{name}_layer_{i}`. Returns {name: per-layer values} (gigatron
    extra, handy for tests and simple loops).
    """
    tracker = get_moe_layer_wise_logging_tracker()
    if force_initialize and track_names is not None:
        for key in track_names:
            tracker.setdefault(
                key,
                {
                    "values": torch.zeros(num_layers),
                    "reduce_group": None,
                    "avg_group": None,
                    "reduce_group_has_dp": False,
                },
            )
    reduce_aux_losses_tracker_across_ranks(track_names, pg_collection=pg_collection)
    if moe_layer_freq is None:
        num_moe_layers = num_layers
    elif isinstance(moe_layer_freq, int):
        num_moe_layers = sum(1 for i in range(num_layers) if i % moe_layer_freq == 0)
    else:
        num_moe_layers = sum(moe_layer_freq)
    if mtp_num_layers is not None:
        num_moe_layers += mtp_num_layers
    per_layer = {k: v["values"].float() * loss_scale for k, v in tracker.items()}
    for name, values in per_layer.items():
        mean = values.sum() / num_moe_layers
        if total_loss_dict is not None:
            total_loss_dict[name] = total_loss_dict.get(name, 0) + mean
        if writer is not None:
            writer.add_scalar(name, mean, iteration)
            if per_layer_logging:
                for i, value in enumerate(values.tolist()):
                    writer.add_scalar(f"moe/{name}_layer_{i}", value, iteration)
        if wandb_writer is not None:
            wandb_writer.log({name: mean}, iteration)
            if per_layer_logging:
                wandb_writer.log(
                    {f"moe/{name}_layer_{i}": v for i, v in enumerate(values.tolist())}, iteration
                )
    result = {k: v.clone() for k, v in per_layer.items()}
    clear_aux_losses_tracker()
    return result

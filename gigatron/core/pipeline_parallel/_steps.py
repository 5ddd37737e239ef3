"""One forward step and one backward step of one microbatch on one model chunk.

Mirrors `forward_step`, `forward_step_calc_loss`, `backward_step`, `deallocate_output_tensor` and
`custom_backward` of `megatron.core.pipeline_parallel.schedules`, including the in-place loss
scaling rules:

- loss_func returns (loss, report):             loss *= cp_size; loss /= num_microbatches
- loss_func returns (loss, num_tokens, report): loss /= max(num_tokens, 1); loss /= num_microbatches
  (no division at all with config.calculate_per_token_loss: finalize_model_grads divides the
  gradients by the global token count instead)

The scaled loss is what backward starts from, so the gradients of M microbatches add up to the
gradient of the mean loss. `report` is appended to `forward_data_store` (the schedules' return).
"""

from __future__ import annotations

import contextlib

import torch

from gigatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler
from gigatron.core.transformer.multi_token_prediction import MTPLossAutoScaler
from gigatron.core.utils import get_attr_wrapped_model


def deallocate_output_tensor(out, deallocate_pipeline_outputs: bool = False) -> None:
    """Free `out.data` (keep a 1-element placeholder) once it has been sent: only its grad_fn
    is needed for backward."""
    if out is None or not deallocate_pipeline_outputs:
        return
    if out._base is not None:
        raise RuntimeError(
            "deallocate_pipeline_outputs cannot free a view; return a viewless tensor "
            "(gigatron.core.utils.make_viewless_tensor) from the pipeline stage"
        )
    out.data = torch.empty((1,), device=out.device, dtype=out.dtype)


def custom_backward(output: torch.Tensor, grad_output: torch.Tensor | None) -> None:
    """Backward from an output whose data was freed by `deallocate_output_tensor`.

    Calls the autograd engine directly: `torch.autograd.backward` would reject the shape mismatch
    between the 1-element placeholder and the full-size gradient.
    """
    if grad_output is None:
        grad_output = torch.ones_like(output)
    torch.autograd.Variable._execution_engine.run_backward(
        tensors=(output,),
        grad_tensors=(grad_output,),
        keep_graph=False,
        create_graph=False,
        inputs=tuple(),
        allow_unreachable=True,
        accumulate_grad=True,
    )


def set_current_microbatch(model, microbatch_id: int) -> None:
    """Tell the decoder layers which microbatch runs (used by some recompute/offload paths)."""
    try:
        owner = get_attr_wrapped_model(model, "decoder", allow_none=False, return_model_obj=True)
    except RuntimeError:
        return
    for layer in getattr(owner.decoder, "layers", []):
        layer.current_microbatch = microbatch_id


def _autocast(config):
    if not getattr(config, "enable_autocast", False):
        return contextlib.nullcontext()
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.autocast(device_type, dtype=config.autocast_dtype)


def forward_step_calc_loss(
    output_tensor,
    loss_func,
    config,
    *,
    collect_non_loss_data: bool,
    num_microbatches: int,
    forward_data_store: list,
    cp_group_size: int,
    is_last_stage: bool,
):
    """On the last stage apply `loss_func` and Megatron's scaling; return (output, num_tokens)."""
    num_tokens = torch.tensor(0, dtype=torch.int)
    if is_last_stage:
        if loss_func is None:
            forward_data_store.append(output_tensor)
        elif collect_non_loss_data:
            forward_data_store.append(loss_func(output_tensor, non_loss_data=True))
        else:
            output_tensor, num_tokens, reduced = _scaled_loss(
                loss_func(output_tensor), config, num_microbatches, cp_group_size
            )
            forward_data_store.append(reduced)
    return output_tensor, num_tokens


def _scaled_loss(outputs, config, num_microbatches, cp_group_size):
    """(loss, report) or (loss, num_tokens, report) -> (loss scaled in place, tokens, report)."""
    if len(outputs) == 3:
        loss, num_tokens, reduced = outputs
        num_tokens = torch.as_tensor(num_tokens)
        if not getattr(config, "calculate_per_token_loss", False):
            loss /= torch.clamp(num_tokens, min=1)  # all tokens masked -> no 1/0
            loss /= num_microbatches
        return loss, num_tokens, reduced
    if len(outputs) == 2:
        loss, reduced = outputs
        loss *= cp_group_size  # legacy: per-CP-rank mean loss -> sum over CP ranks
        loss /= num_microbatches
        return loss, torch.tensor(0, dtype=torch.int), reduced
    raise ValueError(
        f"loss_func returned {len(outputs)} values; expected (loss, report) or "
        "(loss, num_tokens, report)"
    )


def _set_moe_aux_loss_scale(config, model, cp_group_size, num_microbatches) -> None:
    """MoE aux losses backprop through a side channel; give them the main loss's scaling (a
    tensor on the device of `model`'s params). Every stage, before each forward: Megatron sets
    it after the forward, read in the backward; torch.compile's partitioner may move d(aux),
    which does not depend on the output grad, into the compiled forward, so it must hold
    already. Same value (the loss scale changes only at the optimizer step)."""
    if getattr(config, "num_moe_experts", None) is None:
        return

    param = next(iter(model.parameters()), None)
    if param is None:
        return
    ones = torch.ones(1, device=param.device)
    loss_scale = config.grad_scale_func(ones) if config.grad_scale_func is not None else ones
    if getattr(config, "calculate_per_token_loss", False):
        MoEAuxLossAutoScaler.set_loss_scale(loss_scale)
    else:
        MoEAuxLossAutoScaler.set_loss_scale(loss_scale * cp_group_size / num_microbatches)


def _set_mtp_loss_scale(config, model, num_microbatches) -> None:
    """The MTP losses' backward scale (MTPLossAutoScaler): mtp_grad_scale_func's, else the main
    loss's (grad_scale_func), divided by num_microbatches unless calculate_per_token_loss, as
    Megatron's schedules set it. Before each forward, for the reason given above."""
    if getattr(config, "mtp_num_layers", None) is None:
        return
    param = next(iter(model.parameters()), None)
    if param is None:
        return
    ones = torch.ones(1, device=param.device)
    custom = getattr(config, "mtp_grad_scale_func", None)
    if custom is not None:
        loss_scale = torch.as_tensor(custom(), dtype=torch.float32, device=param.device)
    elif config.grad_scale_func is not None:
        loss_scale = config.grad_scale_func(ones)
    else:
        loss_scale = ones
    if getattr(config, "calculate_per_token_loss", False):
        MTPLossAutoScaler.set_loss_scale(loss_scale)
    else:
        MTPLossAutoScaler.set_loss_scale(loss_scale / num_microbatches)


def forward_step(
    forward_step_func,
    data_iterator,
    model,
    num_microbatches: int,
    input_tensor,
    forward_data_store: list,
    config,
    cp_group_size: int = 1,
    collect_non_loss_data: bool = False,
    checkpoint_activations_microbatch=None,
    is_first_microbatch: bool = False,
    current_microbatch: int | None = None,
    vp_stage: int | None = None,
    is_last_stage: bool = True,
):
    """Run `forward_step_func(data_iterator, model)` with `input_tensor` set on the model.

    input_tensor: [s, b, h] from the previous stage (None on the first stage), or a list.
    Returns (output_tensor, num_tokens): the (scaled) loss on the last stage, the [s, b, h]
    activation otherwise; a list when `input_tensor` was a list.
    """
    if config.timers is not None:
        config.timers("forward-compute", log_level=2).start()
    if is_first_microbatch and hasattr(model, "set_is_first_microbatch"):
        model.set_is_first_microbatch()
    if current_microbatch is not None:
        set_current_microbatch(model, current_microbatch)
    unwrap = not isinstance(input_tensor, list)
    inputs = [input_tensor] if unwrap else input_tensor
    get_attr_wrapped_model(model, "set_input_tensor")(inputs)
    _set_moe_aux_loss_scale(config, model, cp_group_size, num_microbatches)  # before the forward
    _set_mtp_loss_scale(config, model, num_microbatches)
    with _autocast(config):
        if checkpoint_activations_microbatch is None:
            output_tensor, loss_func = forward_step_func(data_iterator, model)
        else:
            output_tensor, loss_func = forward_step_func(
                data_iterator, model, checkpoint_activations_microbatch
            )
    output_tensor, num_tokens = forward_step_calc_loss(
        output_tensor,
        loss_func,
        config,
        collect_non_loss_data=collect_non_loss_data,
        num_microbatches=num_microbatches,
        forward_data_store=forward_data_store,
        cp_group_size=cp_group_size,
        is_last_stage=is_last_stage,
    )
    if config.timers is not None:
        config.timers("forward-compute").stop()
    return (output_tensor, num_tokens) if unwrap else ([output_tensor], num_tokens)


def backward_step(input_tensor, output_tensor, output_tensor_grad, model_type, config):
    """Backward of one microbatch; returns d loss / d input_tensor (None on the first stage).

    output_tensor_grad is None on the last stage, where the loss first goes through
    `config.grad_scale_func` (fp16 loss scaling).
    """
    if config.timers is not None:
        config.timers("backward-compute", log_level=2).start()
    unwrap = not isinstance(input_tensor, list)
    inputs = [input_tensor] if unwrap else input_tensor
    for x in inputs:
        if x is not None:
            x.retain_grad()
    outputs = output_tensor if isinstance(output_tensor, list) else [output_tensor]
    grads = output_tensor_grad if isinstance(output_tensor_grad, list) else [output_tensor_grad]
    if grads[0] is None and config.grad_scale_func is not None:
        outputs[0] = config.grad_scale_func(outputs[0])
    if outputs[0].requires_grad:
        if config.deallocate_pipeline_outputs:
            custom_backward(outputs[0], grads[0])
        else:
            torch.autograd.backward(outputs[0], grad_tensors=grads[0])
    input_grads = [None if x is None else x.grad for x in inputs]
    if config.timers is not None:
        config.timers("backward-compute").stop()
    return input_grads[0] if unwrap else input_grads

"""`gpt_builder`: the GPTModel the training flags describe (Megatron-LM's gpt_builders.py).

Megatron-LM keeps its model builders beside pretrain_gpt.py so that other programs (generation,
RL, estimators) build the same model without importing the training script; here they sit in
the training library for the same reason: `gigatron generate` and `gigatron estimate` build the
model `gigatron train` trains through `model_provider(gpt_builder, ...)`.
"""

from __future__ import annotations

from gigatron.core.models.gpt import GPTModel
from gigatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_layer_fast_spec,
    get_gpt_mtp_block_spec,
)
from gigatron.training import _pretrain_common as common
from gigatron.training._config_from_args import core_transformer_config_from_args
from gigatron.training.peft.lora import lora_from_args
from gigatron.training.utils import args_by_name


def gpt_builder(
    args, pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None
) -> GPTModel:
    """GPTModel from the flags (fast spec: same numbers as the local spec, faster kernels).
    With `--num-experts` the decoder comes from `get_gpt_decoder_block_spec`, as Megatron's
    pretrain_gpt builds it: MoE layers where `--moe-layer-freq` says, dense ones elsewhere.
    With `--mtp-num-layers` the last stage gets the MTP block (`get_gpt_mtp_block_spec`).
    With `--lora-rank` the model is frozen and adapted (`gigatron.training.peft.LoRA`).
    `config` (a TransformerConfig) replaces the one the flags give; `pg_collection` is
    Megatron's argument and must be None (the groups come from parallel_state)."""
    if pg_collection is not None:
        raise ValueError(
            "gpt_builder: pg_collection must be None (gigatron builds models on parallel_state's "
            "groups)"
        )
    if getattr(args, "spec", None) or getattr(args, "hybrid_layer_pattern", None):
        raise ValueError(
            "--spec / --hybrid-layer-pattern build hybrid models: run pretrain_hybrid "
            "(gigatron train-hybrid), not pretrain_gpt"
        )
    config = config if config is not None else core_transformer_config_from_args(args)
    if args.num_experts:
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=True, normalization=args.normalization, vp_stage=vp_stage
        )
    else:
        spec = get_gpt_layer_fast_spec(
            **args_by_name(args, "qk_layernorm multi_latent_attention normalization"),
        )
    mtp_block_spec = None
    if getattr(args, "mtp_num_layers", None) is not None:  # MTP layers copy the last layer
        mtp_block_spec = get_gpt_mtp_block_spec(
            config, spec, use_transformer_engine=True, vp_stage=vp_stage
        )
    model = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        mtp_block_spec=mtp_block_spec,
        **common.language_model_kwargs(args, pre_process, post_process),
        **args_by_name(args, "rotary_percent rotary_base rope_scaling_factor"),
        rope_scaling=args.use_rope_scaling,
        seq_len_interpolation_factor=getattr(args, "rotary_seq_len_interpolation_factor", None),
        vp_stage=vp_stage,
    )
    lora = lora_from_args(args)
    return model if lora is None else lora(model)

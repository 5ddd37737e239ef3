"""The hybrid model the flags describe (Megatron-LM's `hybrid_builders.py` beside
`pretrain_hybrid.py`): HybridModel over `hybrid_stack_spec` and `--hybrid-layer-pattern`."""

from __future__ import annotations

from gigatron.core.models.hybrid import HybridModel
from gigatron.core.models.hybrid.hybrid_layer_specs import hybrid_stack_spec
from gigatron.core.transformer.spec_utils import import_module
from gigatron.training import _pretrain_common as common
from gigatron.training._config_from_args import core_transformer_config_from_args
from gigatron.training.utils import args_by_name


def hybrid_builder(
    args, pre_process=True, post_process=True, vp_stage=None, config=None, pg_collection=None
) -> HybridModel:
    """HybridModel from the flags; `--spec <module> <name>` picks the stack spec (Megatron's
    `megatron.core.*` module names resolve to gigatron's)."""
    if pg_collection is not None:
        raise ValueError("hybrid_builder: pg_collection must be None (parallel_state's groups)")
    if args.hybrid_layer_pattern is None:
        raise ValueError("pretrain_hybrid needs --hybrid-layer-pattern (e.g. 'M*M-')")
    config = config if config is not None else core_transformer_config_from_args(args)
    return HybridModel(
        config=config,
        hybrid_stack_spec=_stack_spec(args.spec),
        hybrid_layer_pattern=args.hybrid_layer_pattern,
        **common.language_model_kwargs(args, pre_process, post_process),
        **args_by_name(args, "rotary_percent rotary_base"),
        seq_len_interpolation_factor=getattr(args, "rotary_seq_len_interpolation_factor", None),
        vp_stage=vp_stage,
    )


def _stack_spec(spec_flag):
    if not spec_flag:
        return hybrid_stack_spec
    if len(spec_flag) != 2:
        raise ValueError(f"--spec takes <module> <name>, got {spec_flag!r}")
    module, name = spec_flag
    if module.startswith("megatron."):
        module = "gigatron." + module[len("megatron.") :]
    return import_module((module, name))

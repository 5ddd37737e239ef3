"""A stack of transformer layers (one pipeline stage's share) plus the final layer norm.

Mirrors `megatron.core.transformer.transformer_block` (TransformerBlock,
TransformerBlockSubmodules). Handles the pipeline input tensor (`set_input_tensor` on stages
without pre_process), the TP RNG fork for dropout under sequence parallelism, and full activation
recompute ('uniform': checkpoint chunks of recompute_num_layers layers; 'block': checkpoint the
first recompute_num_layers layers one by one).

Shapes: s: seq (s/tp under sequence parallelism), b: micro-batch, h: hidden.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from torch import Tensor

from gigatron.core import tensor_parallel
from gigatron.core.dist_checkpointing.utils import replace_prefix_for_sharding
from gigatron.core.fp8_utils import get_fp8_recipe, is_first_last_bf16_layer, set_fp8
from gigatron.core.packed_seq_params import (  # PackedSeqParams: Megatron's name here
    PackedSeqParams,  # noqa: F401
    check_packed_seq_params,
)
from gigatron.core.tensor_parallel.fp8_delayed import (
    attach_delayed_states,
    delayed_scaling_region,
)
from gigatron.core.transformer.mlp import MLP
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.transformer.transformer_layer import (
    TransformerLayer,
    get_num_layers_to_build,
)
from gigatron.core.transformer.utils import check_attention_mask, sharded_state_dict_default
from gigatron.core.utils import make_viewless_tensor


def _non_homogeneous(config, metadata) -> bool:
    """Per-layer checkpoint keys: asked for, or layers that differ (Megatron's rule)."""
    freq = getattr(config, "moe_layer_freq", 1)
    return bool(
        (metadata or {}).get("non_homogeneous_layers", False)
        or isinstance(freq, list)
        or (isinstance(freq, int) and freq > 1)
        or getattr(config, "hetereogenous_dist_checkpoint", False)
        or getattr(config, "heterogeneous_block_specs", False)
    )


@dataclass
class TransformerBlockSubmodules:
    """Per-layer specs and the final norm spec."""

    layer_specs: list[ModuleSpec] = field(default_factory=list)
    layer_norm: ModuleSpec | type | None = None


def _check_layer_spec_has_experts(config, layer_spec) -> None:
    """num_moe_experts with one layer spec for every layer whose MLP is dense would build a
    dense model without a word (the spec from get_gpt_layer_local_spec() without num_experts)."""
    if config.num_moe_experts is None:
        return
    mlp = getattr(getattr(layer_spec, "submodules", None), "mlp", None)
    module = mlp.module if isinstance(mlp, ModuleSpec) else mlp
    if isinstance(module, type) and issubclass(module, MLP):
        raise ValueError(
            f"num_moe_experts ({config.num_moe_experts}) is set but the layer spec builds a "
            f"dense MLP ({module.__name__}) in every layer, so the model would have no experts: "
            "pass the experts to the spec, e.g. get_gpt_layer_local_spec(num_experts="
            "config.num_moe_experts, moe_grouped_gemm=config.moe_grouped_gemm)"
        )


def _get_block_submodules(config, spec, vp_stage) -> TransformerBlockSubmodules:
    if isinstance(spec, TransformerBlockSubmodules):
        return spec
    if isinstance(spec, ModuleSpec):
        if isinstance(spec.module, type) and issubclass(spec.module, TransformerBlock):
            return spec.submodules
        if isinstance(spec.module, type) and issubclass(spec.module, TransformerLayer):
            _check_layer_spec_has_experts(config, spec)
            num_layers = get_num_layers_to_build(config, vp_stage)
            return TransformerBlockSubmodules([spec] * num_layers, WrappedTorchNorm)
    raise ValueError(f"TransformerBlock spec must be a layer or block ModuleSpec, got {spec!r}")


class TransformerBlock(MegatronModule):
    """Layers of this stage; forward(hidden [s, b, h], attention_mask, ...) -> [s, b, h]."""

    def __init__(
        self,
        config,
        spec,
        post_layer_norm: bool = True,
        pre_process: bool = True,
        post_process: bool = True,
        pg_collection=None,
        vp_stage: int | None = None,
    ):
        super().__init__(config)
        if config.hidden_size <= 0:
            raise ValueError(
                f"hidden_size ({config.hidden_size}) must be set to a positive value to build "
                "a TransformerBlock"
            )
        self.submodules = _get_block_submodules(config, spec, vp_stage)
        self.post_layer_norm, self.pre_process, self.post_process = (
            post_layer_norm,
            pre_process,
            post_process,
        )
        self.vp_stage = vp_stage
        self.input_tensor = None
        self.layers = self._build_layers(vp_stage)
        self.num_layers_per_pipeline_rank = len(self.layers)
        self.final_layernorm = None
        if post_process and post_layer_norm:
            self.final_layernorm = build_module(
                self.submodules.layer_norm or WrappedTorchNorm,
                config=config,
                hidden_size=config.hidden_size,
                eps=config.layernorm_epsilon,
            )

    def _build_layers(self, vp_stage):
        import torch

        from gigatron.core.layout_invariant_init import init_rng_scope
        from gigatron.core.transformer.transformer_layer import get_transformer_layer_offset

        offset = get_transformer_layer_offset(self.config, vp_stage)
        fp8_recipe = get_fp8_recipe(self.config)
        self._fp8_delayed = _DelayedScaling(fp8_recipe, self.config)  # Fp8DelayedStates below
        layers = []
        for i, spec in enumerate(self.submodules.layer_specs):
            # Seeded by the global layer number: the same layer gets the same weights whatever
            # stage builds it (see gigatron.core.layout_invariant_init).
            with init_rng_scope(self.config, f"layer.{offset + i + 1}"):
                layers.append(
                    build_module(spec, config=self.config, layer_number=i + 1, vp_stage=vp_stage)
                )
            # FP8 GEMMs in the layer's linears, as Megatron's fp8 context around each layer
            if fp8_recipe is not None and not is_first_last_bf16_layer(self.config, offset + i + 1):
                set_fp8(layers[-1], fp8_recipe)
                self._fp8_delayed.states += attach_delayed_states(layers[-1], fp8_recipe)
        return torch.nn.ModuleList(layers)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """Megatron's layer stacking: the entry of local layer j (dict key
        `<prefix>layers.{j}.<name>`, global index i = layer_number - 1, pipeline and virtual
        stage offset included) gets checkpoint key `<prefix>layers.<name>` and the prepended
        layer axis (0, i, num_layers); per-layer keys `<prefix>layers.{i}.<name>` instead with
        `metadata={"non_homogeneous_layers": True}` or when the layers differ (MoE on some
        layers only, `moe_layer_freq`)."""
        if sharded_offsets:
            raise ValueError(
                f"TransformerBlock.sharded_state_dict: sharded_offsets ({sharded_offsets}) must "
                "be empty (the block prepends the layer axis itself)"
            )
        if (metadata or {}).get("singleton_local_shards", False):
            raise ValueError(
                "sharded_state_dict: metadata singleton_local_shards=True (one checkpoint key "
                "per expert / GLU half) is not supported by gigatron"
            )
        per_layer = _non_homogeneous(self.config, metadata)
        layer_prefix = f"{prefix}layers."
        num_layers = self.config.num_layers
        out = {}
        for j, layer in enumerate(self.layers):
            i = layer.layer_number - 1
            local_prefix = f"{layer_prefix}{j}."
            if per_layer:
                sharded_prefix, offsets = f"{layer_prefix}{i}.", ()
            else:
                sharded_prefix, offsets = layer_prefix, ((0, i, num_layers),)
            sharded = layer.sharded_state_dict(local_prefix, offsets, metadata)
            replace_prefix_for_sharding(sharded, local_prefix, sharded_prefix)
            out.update(sharded)
        for name, module in self.named_children():
            if module is not self.layers:
                out.update(sharded_state_dict_default(module, f"{prefix}{name}.", (), metadata))
        return out

    def _get_layer(self, layer_number: int):
        return self.layers[layer_number]

    def set_input_tensor(self, input_tensor: Tensor) -> None:
        """Set the activation received from the previous pipeline stage."""
        self.input_tensor = input_tensor

    def _rng_context(self):
        cfg = self.config
        dropout_on = self.training and (cfg.hidden_dropout > 0 or cfg.attention_dropout > 0)
        if cfg.sequence_parallel and dropout_on:
            from gigatron.core import tensor_parallel

            # Under SP each TP rank holds different tokens, so dropout masks must differ.
            return tensor_parallel.get_cuda_rng_tracker().fork()
        return contextlib.nullcontext()

    def _run_layers(self, start, end, hidden_states, context, **kw):
        for index in range(start, end):
            hidden_states, context = self.layers[index](hidden_states, context=context, **kw)
        return hidden_states, context

    def _checkpointed_forward(self, hidden_states, context, **kw):

        cfg, n = self.config, len(self.layers)

        def chunk(start, end):
            def run(h, *ctx):
                h, _ = self._run_layers(start, end, h, ctx[0] if ctx else None, **kw)
                return h

            return run

        extra = (context,) if context is not None else ()
        dsa = cfg.distribute_saved_activations and not cfg.sequence_parallel
        if cfg.recompute_method == "uniform":
            for start in range(0, n, cfg.recompute_num_layers):
                end = min(n, start + cfg.recompute_num_layers)
                hidden_states = tensor_parallel.checkpoint(
                    chunk(start, end), dsa, hidden_states, *extra
                )
        else:  # block
            for index in range(n):
                if index < cfg.recompute_num_layers:
                    hidden_states = tensor_parallel.checkpoint(
                        chunk(index, index + 1), dsa, hidden_states, *extra
                    )
                else:
                    hidden_states = chunk(index, index + 1)(hidden_states, *extra)
        return hidden_states

    def forward(
        self,
        hidden_states: Tensor | None,
        attention_mask: Tensor | None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        rotary_pos_emb: Tensor | None = None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        rotary_pos_cos_sin=None,
        attention_bias=None,
        inference_context=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        padding_mask=None,
        extract_layer_indices=None,
        *,
        inference_params=None,
        dynamic_inference_decode_only=None,
    ) -> Tensor:
        """hidden_states [s, b, h] -> [s, b, h]; without pre_process the input comes from
        set_input_tensor."""
        if extract_layer_indices is not None:
            raise ValueError(
                "extract_layer_indices is not supported by gigatron's TransformerBlock"
            )
        check_attention_mask(attention_mask)
        check_attention_mask(context_mask, "context_mask")
        if not self.pre_process:
            hidden_states = self.input_tensor
        if packed_seq_params is not None:  # once per forward: it reads the bounds on the host
            cfg = self.config
            seq_len = hidden_states.shape[0] * cfg.context_parallel_size
            seq_len *= cfg.tensor_model_parallel_size if cfg.sequence_parallel else 1
            check_packed_seq_params(
                packed_seq_params, seq_len, hidden_states.shape[1], cfg.context_parallel_size
            )
        hidden_states = make_viewless_tensor(hidden_states, requires_grad=True, keep_graph=True)
        kw = dict(
            attention_mask=attention_mask,
            context_mask=context_mask,
            rotary_pos_emb=rotary_pos_emb,
            attention_bias=attention_bias,
            packed_seq_params=packed_seq_params,
            inference_context=inference_context,
        )
        delayed = getattr(self, "_fp8_delayed", None) or _DelayedScaling(None, self.config)
        with (
            self._rng_context(),
            delayed_scaling_region(
                hidden_states, delayed.states, delayed.recipe, delayed.group
            ) as hidden_states,
        ):
            if self.config.recompute_granularity == "full" and self.training:
                hidden_states = self._checkpointed_forward(hidden_states, context, **kw)
            elif getattr(self, "_run_compiled_layer_groups", None):  # compile_transformer_layers
                # Not under full recompute: its checkpointed chunks run the layers themselves.
                hidden_states, _ = self._run_compiled_layer_groups(hidden_states, context, kw)
            else:
                hidden_states, _ = self._run_layers(
                    0, len(self.layers), hidden_states, context, **kw
                )
        if self.final_layernorm is not None:
            hidden_states = self.final_layernorm(hidden_states)
            hidden_states = make_viewless_tensor(hidden_states, requires_grad=True, keep_graph=True)
        return hidden_states


class _DelayedScaling:
    """The block's FP8 delayed-scaling states and the group their amaxes are reduced over
    (Megatron's `get_amax_reduction_group(with_context_parallel=True, tp_only_amax_red)`;
    None before model parallelism is initialized). Empty unless fp8_recipe='delayed'."""

    def __init__(self, recipe, config):
        self.recipe, self.states, self.group = recipe, [], None
        if recipe is None or not recipe.delayed:
            return
        from gigatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            self.group = parallel_state.get_amax_reduction_group(
                with_context_parallel=True, tp_only_amax_red=config.tp_only_amax_red
            )

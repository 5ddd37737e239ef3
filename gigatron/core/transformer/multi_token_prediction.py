"""Multi-token prediction (MTP): D extra depths, each predicting one token further ahead.

Mirrors `megatron.core.transformer.multi_token_prediction` (DeepSeek-V3 technical report,
arXiv:2412.19437, section 2.2). Depth k (1..D) at position i combines the previous depth's hidden
state h_i^{k-1} (the decoder's output for k = 1) with the embedding of token i+k through the
model's shared embedding:

    h'_i = eh_proj([enorm(emb(t_{i+k})); hnorm(h_i^{k-1})])      [s, b, 2h] -> [s, b, h]
    h_i^k = final_layernorm(TransformerLayer(h'_i))

and the shared output layer predicts t_{i+k+1} from h_i^k. The block returns the decoder's
hidden states with every depth's output concatenated along the sequence ([(1+D)s, b, h]);
`process_mtp_loss` on the last stage splits them again, computes each depth's loss and attaches
(mtp_loss_scaling_factor / D) x the depth's mean loss to the main loss's backward through
`MTPLossAutoScaler` (the logged main loss stays the plain LM loss; the MTP losses are logged as
`mtp_{k} loss`). Without a pipeline layout the whole block sits on the last pipeline stage.

Shapes: s: sequence on this rank (s/cp under CP; s/tp inside SP regions), b: micro-batch,
h: hidden, D: mtp_num_layers.
"""

from __future__ import annotations

import warnings
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.dist_checkpointing.utils import apply_prefix_mapping, replace_prefix_for_sharding
from gigatron.core.layout_invariant_init import init_rng_scope
from gigatron.core.transformer._mtp_helpers import (
    MTPLossAutoScaler,
    MTPLossLoggingHelper,
    compute_mtp_acceptance_counts,
    roll_tensor,
)
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.spec_utils import ModuleSpec, build_module
from gigatron.core.transformer.torch_norm import WrappedTorchNorm
from gigatron.core.utils import make_tp_sharded_tensor_for_checkpoint, make_viewless_tensor

__all__ = [
    "MTPLossAutoScaler",
    "MTPLossLoggingHelper",
    "MultiTokenPredictionBlock",
    "MultiTokenPredictionBlockSubmodules",
    "MultiTokenPredictionLayer",
    "MultiTokenPredictionLayerSubmodules",
    "get_mtp_layer_offset",
    "get_mtp_layer_spec",
    "get_mtp_layer_spec_for_backend",
    "get_mtp_num_layers_to_build",
    "get_mtp_ranks",
    "mtp_on_this_rank",
    "process_mtp_loss",
    "roll_tensor",
    "tie_output_layer_state_dict",
    "tie_word_embeddings_state_dict",
]


# ---------------------------------------------------------------- specs and placement
@dataclass
class MultiTokenPredictionLayerSubmodules:
    """enorm / hnorm: norms of the embedding and of the hidden state; layer_norm: the final
    norm before the shared output layer; eh_proj: the [2h -> h] column-parallel projection;
    mtp_model_layer: the TransformerLayer spec (the decoder's last layer's)."""

    enorm: object
    hnorm: object
    layer_norm: object
    eh_proj: ModuleSpec | type | None = None
    mtp_model_layer: ModuleSpec | type | None = None


@dataclass
class MultiTokenPredictionBlockSubmodules:
    """One MultiTokenPredictionLayer spec per depth."""

    layer_specs: list[ModuleSpec] | None = None


def get_mtp_layer_spec(
    mtp_model_layer_spec: ModuleSpec, use_transformer_engine: bool
) -> ModuleSpec:
    """The MTP layer around `mtp_model_layer_spec` with gigatron's norms and column-parallel
    projection (`use_transformer_engine` picks the same modules: there is no TE here)."""
    return get_mtp_layer_spec_for_backend(mtp_model_layer_spec, backend=None)


def get_mtp_layer_spec_for_backend(mtp_model_layer_spec: ModuleSpec, backend=None) -> ModuleSpec:
    """As Megatron's: `backend` (a BackendSpecProvider) supplies layer_norm() and
    column_parallel_linear(); None: WrappedTorchNorm and tensor_parallel.ColumnParallelLinear."""
    norm = backend.layer_norm() if backend is not None else WrappedTorchNorm
    linear = (
        backend.column_parallel_linear()
        if backend is not None
        else tensor_parallel.ColumnParallelLinear
    )
    return ModuleSpec(
        module=MultiTokenPredictionLayer,
        submodules=MultiTokenPredictionLayerSubmodules(
            enorm=norm, hnorm=norm, layer_norm=norm, eh_proj=linear,
            mtp_model_layer=mtp_model_layer_spec,
        ),
    )  # fmt: skip


def _check_no_layout(config) -> None:
    if getattr(config, "pipeline_model_parallel_layout", None) is not None:
        raise ValueError(
            "multi-token prediction with pipeline_model_parallel_layout is not supported by "
            "gigatron: the MTP block sits on the last pipeline stage"
        )


def mtp_on_this_rank(
    layout=None,
    mtp_num_layers: int | None = None,
    ignore_virtual: bool = True,
    vp_stage: int | None = None,
) -> bool:
    """Whether this rank (this virtual stage unless `ignore_virtual`) builds the MTP block: the
    last pipeline stage when mtp_num_layers is set (Megatron's rule without a layout)."""
    if layout is not None:
        raise ValueError(
            "multi-token prediction with pipeline_model_parallel_layout is not supported by "
            "gigatron: the MTP block sits on the last pipeline stage"
        )
    if not mtp_num_layers:
        return False
    return parallel_state.is_pipeline_last_stage(ignore_virtual=ignore_virtual, vp_stage=vp_stage)


def get_mtp_ranks(pp_ranks: list[int], config) -> list[int]:
    """Global ranks (of one pipeline) holding MTP layers: the last one, or none."""
    if not config.mtp_num_layers:
        return []
    _check_no_layout(config)
    return [pp_ranks[-1]]


def get_mtp_layer_offset(config, vp_stage: int | None = None) -> int:
    """Index of this stage's first MTP layer: 0 (all of them sit on one stage)."""
    _check_no_layout(config)
    return 0


def get_mtp_num_layers_to_build(config, vp_stage: int | None = None, pp_rank=None) -> int:
    """mtp_num_layers on the last (virtual) pipeline stage, 0 elsewhere."""
    _check_no_layout(config)
    if not config.mtp_num_layers:
        return 0
    if pp_rank is not None:
        last = pp_rank == config.pipeline_model_parallel_size - 1
        vp = config.virtual_pipeline_model_parallel_size
        last = last and (vp is None or vp_stage is None or vp_stage == vp - 1)
    else:
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    return config.mtp_num_layers if last else 0


# ---------------------------------------------------------------- the loss
def process_mtp_loss(
    hidden_states: Tensor,
    labels: Tensor | None,
    loss_mask: Tensor | None,
    output_layer,
    output_weight: Tensor | None,
    runtime_gather_output: bool | None,
    is_training: bool,
    compute_language_model_loss,
    config,
    cp_group=None,
    tp_group=None,
    packed_seq_params=None,
    scale_logits_fn=None,
    input_ids: Tensor | None = None,
) -> Tensor:
    """[(1+D)s, b, h] -> the decoder's part [s, b, h], carrying the D depth losses.

    Depth k's loss is the cross entropy of the shared output layer on its hidden states against
    labels (and loss_mask) rolled k tokens left (roll_tensor; CP-aware), summed over valid
    tokens, divided by their count and by D, times mtp_loss_scaling_factor, and attached to the
    returned tensor with MTPLossAutoScaler (with calculate_per_token_loss: multiplied by the
    unrolled token count instead, as finalize_model_grads divides by the total). `labels` None:
    derived from input_ids rolled one left (Megatron's RL path); neither: no loss. In training
    each depth's mean loss and greedy acceptance counts go to MTPLossLoggingHelper."""
    depths = config.mtp_num_layers
    chunks = torch.chunk(hidden_states, 1 + depths, dim=0)
    hidden_states = chunks[0]
    derived = labels is None
    if derived:
        if input_ids is None:
            return hidden_states
        labels, _ = roll_tensor(input_ids, cp_group=cp_group, packed_seq_params=packed_seq_params)
    if config.mtp_detach_heads:
        weight = output_weight if output_weight is not None else output_layer.weight
        output_weight = weight.detach()
    mtp_labels = labels.clone()
    loss_mask = torch.ones_like(mtp_labels) if loss_mask is None else loss_mask
    roll = dict(cp_group=cp_group, packed_seq_params=packed_seq_params)
    if derived:  # the label rolled in past the window is made up: mask it
        loss_mask, _ = roll_tensor(loss_mask, **roll)
    original_num_tokens = loss_mask.sum()
    scale = config.mtp_loss_scaling_factor / depths
    vocab_sharded = not (
        runtime_gather_output
        if runtime_gather_output is not None
        else getattr(output_layer, "gather_output", False)
    )
    for depth in range(depths):
        logits, _ = output_layer(
            chunks[depth + 1], weight=output_weight, runtime_gather_output=runtime_gather_output
        )  # [s, b, V/tp]
        if scale_logits_fn is not None:
            logits = scale_logits_fn(logits)
        mtp_labels, _ = roll_tensor(mtp_labels, **roll)
        loss_mask, num_tokens = roll_tensor(loss_mask, **roll)
        mtp_loss = loss_mask * compute_language_model_loss(mtp_labels, logits)  # [b, s]
        safe_num_tokens = num_tokens.clamp(min=1)
        if is_training:
            mean = mtp_loss.sum() * (num_tokens > 0).to(mtp_loss.dtype) / safe_num_tokens
            correct, total = compute_mtp_acceptance_counts(
                logits, mtp_labels, loss_mask, vocab_sharded, tp_group
            )
            MTPLossLoggingHelper.save_metrics_to_tracker(
                mean, correct, total, depth, depths,
                avg_group=parallel_state.get_data_parallel_group(with_context_parallel=True),
            )  # fmt: skip
        if config.calculate_per_token_loss:
            attached = scale * mtp_loss * (original_num_tokens / safe_num_tokens)
        else:
            attached = scale * mtp_loss / safe_num_tokens
        hidden_states = MTPLossAutoScaler.apply(hidden_states, attached)
    return hidden_states


# ---------------------------------------------------------------- one depth
class MultiTokenPredictionLayer(MegatronModule):
    """One MTP depth: norms, [2h -> h] projection, a TransformerLayer, the final norm."""

    def __init__(
        self,
        config,
        submodules: MultiTokenPredictionLayerSubmodules,
        layer_number: int = 1,
        vp_stage: int | None = None,
        pg_collection=None,
        mtp_layer_pattern: str | None = None,
        hybrid_submodules=None,
        name: str | None = None,
    ):
        super().__init__(config)
        if mtp_layer_pattern is not None or hybrid_submodules is not None:
            raise ValueError(
                "mtp_layer_pattern / hybrid_submodules (hybrid-model MTP) are not supported by "
                "gigatron"
            )
        self.submodules = submodules
        self.sequence_parallel = config.sequence_parallel
        self.layer_number = layer_number + get_mtp_layer_offset(config, vp_stage)
        self.vp_stage = vp_stage
        self.cp_group = getattr(pg_collection, "cp", None)
        self.tp_group = getattr(pg_collection, "tp", None)
        self.mtp_layer_pattern = None
        norm = dict(config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)
        self.enorm = build_module(submodules.enorm, **norm)
        self.hnorm = build_module(submodules.hnorm, **norm)
        # [s, b, 2h] (embedding; hidden state) -> [s, b, h/tp], gathered to [s, b, h] below
        self.eh_proj = build_module(
            submodules.eh_proj, config.hidden_size * 2, config.hidden_size, config=config,
            init_method=config.init_method, gather_output=False, bias=False,
            skip_bias_add=False, is_expert=False, tp_comm_buffer_name="mtp_eh_proj",
        )  # fmt: skip
        self.mtp_model_layer = build_module(
            submodules.mtp_model_layer, config=config, layer_number=self.layer_number,
            vp_stage=vp_stage, is_mtp_layer=True,
        )  # fmt: skip
        self.final_layernorm = build_module(submodules.layer_norm, **norm)

    def _get_embeddings(self, input_ids, position_ids, embedding, hidden_states, packed_seq_params):
        """Roll ids and positions one token left, embed them: (ids, positions, emb [s, b, h],
        hidden_states [s, b, h])."""
        roll = dict(cp_group=self._cp_group(), packed_seq_params=packed_seq_params)
        input_ids, _ = roll_tensor(input_ids, **roll)
        position_ids, _ = roll_tensor(position_ids, **roll)
        decoder_input = embedding(input_ids=input_ids, position_ids=position_ids)
        if self.config.mtp_detach_heads:
            decoder_input = decoder_input.detach()
        hidden_states = make_viewless_tensor(hidden_states, requires_grad=True, keep_graph=True)
        return input_ids, position_ids, decoder_input, hidden_states

    def _cp_group(self):
        if self.cp_group is not None:
            return self.cp_group
        if parallel_state.model_parallel_is_initialized():
            return parallel_state.get_context_parallel_group()
        return None

    def _concat_embeddings(self, hidden_states: Tensor, decoder_input: Tensor) -> Tensor:
        """[s, b, h] x 2 -> eh_proj([enorm(emb); hnorm(h)]) [s, b, h] (SP: [s/tp, b, h])."""
        both = torch.cat((self.enorm(decoder_input), self.hnorm(hidden_states)), dim=-1)
        out, _ = self.eh_proj(both)  # [s, b, h/tp]
        out = tensor_parallel.gather_from_tensor_model_parallel_region(out, group=self.tp_group)
        if self.sequence_parallel:
            out = tensor_parallel.scatter_to_sequence_parallel_region(out, group=self.tp_group)
        return out

    def _proj_and_transformer_layer(self, hidden_states, decoder_input, **layer_kwargs) -> Tensor:
        tracker = tensor_parallel.get_cuda_rng_tracker()
        forked = self.sequence_parallel and tracker.is_initialized()
        with tracker.fork() if forked else nullcontext():
            hidden_states = self._concat_embeddings(hidden_states, decoder_input)
            hidden_states, _ = self.mtp_model_layer(hidden_states=hidden_states, **layer_kwargs)
        return self.final_layernorm(hidden_states)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        hidden_states: Tensor,
        attention_mask: Tensor | None,
        padding_mask=None,
        context=None,
        context_mask=None,
        rotary_pos_emb: Tensor | None = None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        attention_bias=None,
        inference_params=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        embedding=None,
    ):
        """input_ids / position_ids [b, s] of the previous depth, hidden_states [s, b, h] ->
        (hidden_states [s, b, h], input_ids, position_ids, padding_mask), the ids rolled one
        token left for the next depth."""
        if context is not None:
            raise ValueError("multi-token prediction with cross attention is not supported")
        input_ids, position_ids, decoder_input, hidden_states = self._get_embeddings(
            input_ids, position_ids, embedding, hidden_states, packed_seq_params
        )
        layer_kwargs = dict(
            attention_mask=attention_mask, rotary_pos_emb=rotary_pos_emb,
            packed_seq_params=packed_seq_params,
        )  # fmt: skip
        if self.config.recompute_granularity == "full" and self.training:
            hidden_states = self._checkpointed_forward(hidden_states, decoder_input, layer_kwargs)
        else:
            hidden_states = self._proj_and_transformer_layer(
                hidden_states, decoder_input, **layer_kwargs
            )
        return hidden_states, input_ids, position_ids, padding_mask

    def _checkpointed_forward(self, hidden_states, decoder_input, layer_kwargs) -> Tensor:
        """Full recompute of the projection and layer: 'uniform' with recompute_num_layers 1;
        'block' is not implemented for MTP (a warning, then no recompute), as in Megatron."""
        method = self.config.recompute_method
        if method == "block":
            warnings.warn(
                "recompute_method == 'block' is not supported for MTP yet. Skipping.",
                stacklevel=2,
            )
            return self._proj_and_transformer_layer(hidden_states, decoder_input, **layer_kwargs)
        if method != "uniform":
            raise ValueError(f"recompute_method ({method!r}) must be 'uniform' or 'block'")
        if self.config.recompute_num_layers != 1:
            raise ValueError(
                f"recompute_num_layers ({self.config.recompute_num_layers}) must be 1 for MTP "
                "recompute (recompute_method 'uniform')"
            )
        run = lambda h, e: self._proj_and_transformer_layer(h, e, **layer_kwargs)  # noqa: E731
        return tensor_parallel.checkpoint(
            run, self.config.distribute_saved_activations, hidden_states, decoder_input
        )

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """MegatronModule's, the inner layer saved under `transformer_layer.` (the name of
        Megatron's GPT MTP checkpoints)."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        apply_prefix_mapping(sharded, {f"{prefix}mtp_model_layer.": f"{prefix}transformer_layer."})
        return sharded


# ---------------------------------------------------------------- the block
class MultiTokenPredictionBlock(MegatronModule):
    """The D MTP depths of this stage (`mtp.layers.{0..D-1}`); with mtp_use_repeated_layer one
    layer applied D times."""

    def __init__(
        self,
        config,
        spec,
        vp_stage: int | None = None,
        pg_collection=None,
        mtp_layer_pattern: str | None = None,
        mtp_num_depths: int = 0,
        hybrid_submodules=None,
        name: str | None = None,
    ):
        super().__init__(config)
        if mtp_layer_pattern is not None or hybrid_submodules is not None:
            raise ValueError("hybrid-model MTP (mtp_layer_pattern) is not supported by gigatron")
        self.submodules = _block_submodules(spec)
        self.mtp_loss_scaling_factor = config.mtp_loss_scaling_factor
        self.vp_stage = vp_stage
        self.mtp_use_repeated_layer = config.mtp_use_repeated_layer
        vp = config.virtual_pipeline_model_parallel_size
        if vp is not None and vp_stage is not None and vp_stage != vp - 1:
            raise ValueError(
                f"MTP layers must be placed on the last virtual pipeline stage; got vp_stage "
                f"({vp_stage}) of virtual_pipeline_model_parallel_size ({vp})"
            )
        specs = self.submodules.layer_specs or []
        if not specs:
            raise ValueError("MultiTokenPredictionBlock needs at least one layer spec")
        if self.mtp_use_repeated_layer:
            specs = specs[:1]
        self.layers = torch.nn.ModuleList()
        for i, layer_spec in enumerate(specs):
            # layout-invariant init: the same MTP weights whichever stage builds them
            with init_rng_scope(config, f"mtp.layer.{i + 1}"):
                self.layers.append(
                    build_module(
                        layer_spec,
                        config=config,
                        layer_number=i + 1,
                        vp_stage=vp_stage,
                        pg_collection=pg_collection,
                    )  # fmt: skip
                )
        if config.mtp_detach_heads:
            for param in self.parameters():  # the optimizer clips their grads apart
                param.grad_norm_group = "mtp"

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        hidden_states: Tensor,
        attention_mask: Tensor | None,
        padding_mask=None,
        context=None,
        context_mask=None,
        rotary_pos_emb: Tensor | None = None,
        rotary_pos_cos=None,
        rotary_pos_sin=None,
        attention_bias=None,
        inference_params=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        extra_block_kwargs: dict | None = None,
        embedding=None,
    ) -> Tensor:
        """hidden_states [s, b, h] (decoder output) -> [(1+D)s, b, h]: it, then each depth's."""
        outputs = [hidden_states]
        if self.config.mtp_detach_heads:
            hidden_states = hidden_states.detach()
        for depth in range(self.config.mtp_num_layers):
            layer = self.layers[0 if self.mtp_use_repeated_layer else depth]
            hidden_states, input_ids, position_ids, padding_mask = layer(
                input_ids=input_ids, position_ids=position_ids, hidden_states=hidden_states,
                attention_mask=attention_mask, padding_mask=padding_mask,
                rotary_pos_emb=rotary_pos_emb, packed_seq_params=packed_seq_params,
                embedding=embedding, **(extra_block_kwargs or {}),
            )  # fmt: skip
            outputs.append(hidden_states)
        return torch.cat(outputs, dim=0)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """`{prefix}layers.{k}.` per depth k (0-based, global over the stages)."""
        sharded = {}
        offset = get_mtp_layer_offset(self.config, self.vp_stage)
        for layer in self.layers:
            local = f"{prefix}layers.{layer.layer_number - 1 - offset}."
            entries = layer.sharded_state_dict(local, (), metadata)
            replace_prefix_for_sharding(entries, local, f"{prefix}layers.{layer.layer_number - 1}.")
            sharded.update(entries)
        return sharded


def _block_submodules(spec) -> MultiTokenPredictionBlockSubmodules:
    if isinstance(spec, MultiTokenPredictionBlockSubmodules):
        return spec
    if isinstance(spec, ModuleSpec) and isinstance(spec.module, type):
        if issubclass(spec.module, MultiTokenPredictionBlock):
            return spec.submodules
    raise TypeError(
        f"MTP block spec must be MultiTokenPredictionBlockSubmodules or a ModuleSpec of "
        f"MultiTokenPredictionBlock, got {type(spec).__name__}"
    )


# ---------------------------------------------------------------- checkpoint tying
def _tie(sharded: dict, weight: Tensor, key: str, tp_group, dp_cp_group) -> None:
    if key not in sharded:
        raise KeyError(f"{key} is not in the sharded state dict")
    dp_rank = torch.distributed.get_rank(dp_cp_group) if dp_cp_group is not None else 0
    sharded[key] = make_tp_sharded_tensor_for_checkpoint(
        weight, key, replica_id=(1, 0, dp_rank), allow_shape_mismatch=True,
        tp_group=tp_group, dp_cp_group=dp_cp_group,
    )  # fmt: skip


def tie_word_embeddings_state_dict(
    sharded_state_dict: dict, word_emb_weight: Tensor, word_emb_weight_key: str, tp_group,
    dp_cp_group,
) -> None:  # fmt: skip
    """The MTP stage's copy of the word embedding, saved as a non-main replica (1, 0, dp) of the
    first stage's tensor under `word_emb_weight_key` (in place)."""
    _tie(sharded_state_dict, word_emb_weight, word_emb_weight_key, tp_group, dp_cp_group)


def tie_output_layer_state_dict(
    sharded_state_dict: dict, output_layer_weight: Tensor, output_layer_weight_key: str,
    tp_group, dp_cp_group,
) -> None:  # fmt: skip
    """The MTP stage's copy of the output weight, a non-main replica (1, 0, dp) (in place)."""
    _tie(sharded_state_dict, output_layer_weight, output_layer_weight_key, tp_group, dp_cp_group)

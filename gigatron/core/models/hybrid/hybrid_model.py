"""HybridModel: embedding -> HybridStack (Mamba / attention / MLP / MoE layers by pattern) ->
output layer (-> vocab-parallel cross entropy).

Mirrors `megatron.core.models.hybrid.hybrid_model.HybridModel` and its deprecated wrapper
`megatron.core.models.mamba.MambaModel` (constructor arguments, `hybrid_layer_pattern` with the
deprecated `hybrid_override_pattern`, pipeline stages by `|`, no position embedding by default).
The output layer and loss are GPTModel's. Not yet: MTP patterns (`/`), the deprecated ratio
arguments, packed sequences; each is refused by name.

Shapes: b: micro-batch, s: seq, h: hidden, V: vocab (/tp on each rank).
"""

from __future__ import annotations

from torch import Tensor

from gigatron.core import parallel_state
from gigatron.core.enums import ModelType
from gigatron.core.models.common.language_module.language_module import LanguageModule
from gigatron.core.models.gpt.gpt_model import GPTModel
from gigatron.core.ssm.mamba_hybrid_layer_allocation import (
    parse_hybrid_pattern,
    select_pipeline_segment,
)
from gigatron.core.transformer.spec_utils import build_module

_POSITION_TYPES = ("learned_absolute", "rope", "none")


class HybridModel(LanguageModule):
    """Hybrid (Mamba-2 + attention) decoder-only language model."""

    def __init__(
        self,
        config,
        hybrid_stack_spec,
        vocab_size: int,
        max_sequence_length: int,
        hybrid_layer_pattern: str | None = None,
        hybrid_attention_ratio: float | None = None,
        hybrid_mlp_ratio: float | None = None,
        hybrid_override_pattern: str | None = None,
        pre_process: bool = True,
        post_process: bool = True,
        fp16_lm_cross_entropy: bool = False,
        logit_dtype=None,
        parallel_output: bool = True,
        share_embeddings_and_output_weights: bool = False,
        position_embedding_type: str = "none",
        rotary_percent: float = 1.0,
        rotary_base: int = 10000,
        scatter_embedding_sequence_parallel: bool = True,
        seq_len_interpolation_factor: float | None = None,
        pg_collection=None,
        vp_stage: int | None = None,
    ) -> None:
        super().__init__(config, pg_collection)
        self._set_language_model_args(locals(), _POSITION_TYPES)
        self.hybrid_stack_spec, self.vp_stage = hybrid_stack_spec, vp_stage
        self.model_type = ModelType.encoder_or_decoder
        pattern = _pattern(hybrid_layer_pattern, hybrid_override_pattern,
                           hybrid_attention_ratio, hybrid_mlp_ratio)  # fmt: skip
        self.hybrid_layer_pattern = pattern
        parsed = parse_hybrid_pattern(pattern)
        if parsed.mtp_num_depths:
            raise ValueError(
                f"hybrid_layer_pattern '{pattern}': MTP patterns ('/') are not implemented for "
                "HybridModel in gigatron"
            )
        layer_types, offset = select_pipeline_segment(
            parsed.main_pattern, vp_stage=vp_stage,
            first_stage_layers=config.num_layers_in_first_pipeline_stage,
            last_stage_layers=config.num_layers_in_last_pipeline_stage,
            pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
            pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
        )  # fmt: skip
        if pre_process:
            self._build_embedding(scatter_to_sequence_parallel=scatter_embedding_sequence_parallel)
        if position_embedding_type == "rope":
            self._build_rotary_pos_emb(rotary_percent, seq_len_interpolation_factor,
                                       rotary_base=rotary_base)  # fmt: skip
        self.decoder = build_module(
            hybrid_stack_spec, config=config, pre_process=pre_process, layer_type_list=layer_types,
            pp_layer_offset=offset, post_process=post_process, pg_collection=pg_collection,
        )  # fmt: skip
        if post_process:
            self._build_output_layer(bias=False)
        if pre_process or post_process:
            self.setup_embeddings_and_output_layer()

    def set_input_tensor(self, input_tensor) -> None:
        """Pipeline input of this stage (a one-element list is accepted, as in Megatron)."""
        self._set_block_input_tensor(self.decoder, input_tensor)

    def forward(self, input_ids: Tensor | None, position_ids: Tensor | None,
                attention_mask: Tensor | None, decoder_input: Tensor | None = None,
                labels: Tensor | None = None, inference_context=None, runtime_gather_output=None,
                *, inference_params=None, loss_mask: Tensor | None = None,
                packed_seq_params=None) -> Tensor:  # fmt: skip
        """input_ids / position_ids [b, s] -> logits [b, s, V/tp], or the fp32 loss [b, s] with
        labels [b, s], or hidden states [s, b, h] on stages without post_process."""
        if packed_seq_params is not None:
            raise ValueError("HybridModel: packed_seq_params (packed sequences) is not implemented")
        context = inference_context if inference_context is not None else inference_params
        if decoder_input is None and self.pre_process:
            decoder_input = self.embedding(input_ids=input_ids, position_ids=position_ids)
        rotary_pos_emb = self._rotary_pos_emb_for(self.decoder, decoder_input, context, None)
        hidden_states = self.decoder(decoder_input, attention_mask, inference_context=context,
                                     rotary_pos_emb=rotary_pos_emb)  # fmt: skip
        if not self.post_process:
            return hidden_states
        return self._output_and_loss(hidden_states, labels, loss_mask, runtime_gather_output)

    # GPTModel's output layer and loss (same head, same numbers)
    _output_and_loss = GPTModel._output_and_loss
    _fused_output_and_loss = GPTModel._fused_output_and_loss

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """Megatron's keys: `embedding.*`, `decoder.layers.<global index>.*` (per layer),
        `decoder.final_norm.*`, `output_layer.weight`."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        sharded.pop(f"{prefix}output_layer._extra_state", None)
        return sharded


def _pattern(layer_pattern, override_pattern, attention_ratio, mlp_ratio) -> str:
    if override_pattern is not None:
        if layer_pattern is not None:
            raise ValueError(
                "hybrid_override_pattern and hybrid_layer_pattern cannot both be set; "
                "hybrid_override_pattern is deprecated, use hybrid_layer_pattern"
            )
        layer_pattern = override_pattern
    if attention_ratio or mlp_ratio:
        raise ValueError(
            f"hybrid_attention_ratio ({attention_ratio}) / hybrid_mlp_ratio ({mlp_ratio}) are "
            "deprecated in Megatron and not implemented in gigatron; give hybrid_layer_pattern"
        )
    if layer_pattern is None:
        raise ValueError("HybridModel needs hybrid_layer_pattern (e.g. 'M*M-')")
    return layer_pattern

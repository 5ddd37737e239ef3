"""GPT: embedding -> TransformerBlock -> output layer (-> vocab-parallel cross entropy).

Mirrors `megatron.core.models.gpt.gpt_model.GPTModel`: same constructor and forward. Logits come
back as [b, s, V/tp] (full V with parallel_output=False), or, with labels, the unreduced fp32
per-token loss [b, s]. Stages without pre_process take their input from `set_input_tensor`;
stages without post_process return the decoder's hidden states [s, b, h].

With `mtp_block_spec` and config.mtp_num_layers the last stage also runs the multi-token
prediction block on the decoder's output and attaches its losses to the returned loss's
backward (gigatron.core.transformer.multi_token_prediction); the returned loss is the main one.

Shapes: b: micro-batch, s: seq, h: hidden, V: (padded) vocabulary, tp: tensor-parallel size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core import parallel_state
from gigatron.core.fusions.chunked_cross_entropy import chunked_linear_cross_entropy
from gigatron.core.models.common.language_module.language_module import LanguageModule
from gigatron.core.transformer.enums import ModelType
from gigatron.core.transformer.multi_token_prediction import (
    MultiTokenPredictionBlock,
    mtp_on_this_rank,
    process_mtp_loss,
)
from gigatron.core.transformer.transformer_block import TransformerBlock
from gigatron.core.transformer.utils import check_attention_mask, logit_softcapping

_POSITION_TYPES = ("learned_absolute", "rope", "yarn", "none")


def _check_integer_ids(name: str, ids) -> None:
    """Token ids, positions and labels index tables: an integer tensor (torch.long), not float."""
    if isinstance(ids, Tensor) and (ids.is_floating_point() or ids.dtype == torch.bool):
        raise TypeError(
            f"{name} has dtype {ids.dtype}; GPTModel takes integer {name} [b, s] (torch.long): "
            f"pass {name}.long()"
        )


class GPTModel(LanguageModule):
    """Decoder-only transformer language model."""

    def __init__(
        self,
        config,
        transformer_layer_spec,
        vocab_size: int,
        max_sequence_length: int,
        pre_process: bool = True,
        post_process: bool = True,
        fp16_lm_cross_entropy: bool = False,
        parallel_output: bool = True,
        share_embeddings_and_output_weights: bool = False,
        position_embedding_type: str = "learned_absolute",
        rotary_percent: float = 1.0,
        rotary_base: int = 10000,
        rope_scaling: bool = False,
        rope_scaling_factor: float = 8.0,
        scatter_embedding_sequence_parallel: bool = True,
        seq_len_interpolation_factor: float | None = None,
        mtp_block_spec=None,
        pg_collection=None,
        vp_stage: int | None = None,
    ) -> None:
        super().__init__(config)
        # checks and stores vocab_size .. position_embedding_type (Megatron-named arguments)
        self._set_language_model_args(locals(), _POSITION_TYPES)
        self.transformer_layer_spec = transformer_layer_spec
        self.vp_stage = vp_stage
        self.model_type = ModelType.encoder_or_decoder
        self.mtp_block_spec = mtp_block_spec
        self.mtp_process = mtp_block_spec is not None and mtp_on_this_rank(
            layout=getattr(config, "pipeline_model_parallel_layout", None),
            mtp_num_layers=config.mtp_num_layers,
            ignore_virtual=False,
            vp_stage=vp_stage,
        )
        _check_mtp_placement(self, config)

        if pre_process or self.mtp_process:  # MTP embeds the shifted tokens with a copy
            self._build_embedding(scatter_to_sequence_parallel=scatter_embedding_sequence_parallel)
        if position_embedding_type == "rope" and not config.multi_latent_attention:
            # (MLA builds its own RoPE, as in Megatron)
            self._build_rotary_pos_emb(
                rotary_percent,
                seq_len_interpolation_factor,
                rotary_base=rotary_base,
                rope_scaling=rope_scaling,
                rope_scaling_factor=rope_scaling_factor,
            )
        elif position_embedding_type == "yarn":
            self._build_yarn_rotary_pos_emb(
                rotary_percent, seq_len_interpolation_factor, rotary_base=rotary_base
            )
        self.decoder = TransformerBlock(
            config=config,
            spec=transformer_layer_spec,
            pre_process=pre_process,
            post_process=post_process,
            vp_stage=vp_stage,
        )
        if self.mtp_process:
            self.mtp = MultiTokenPredictionBlock(config, mtp_block_spec, vp_stage=vp_stage)
        if post_process:
            self._build_output_layer(bias=False)
        if pre_process or post_process or self.mtp_process:
            self.setup_embeddings_and_output_layer()

    def set_input_tensor(self, input_tensor) -> None:
        """Pipeline input of this stage (a one-element list is accepted, as in Megatron)."""
        self._set_block_input_tensor(self.decoder, input_tensor)

    def forward(
        self,
        input_ids: Tensor | None,
        position_ids: Tensor | None,
        attention_mask: Tensor | None,
        decoder_input: Tensor | None = None,
        labels: Tensor | None = None,
        inference_context=None,
        packed_seq_params=None,
        extra_block_kwargs: dict | None = None,
        runtime_gather_output: bool | None = None,
        *,
        inference_params=None,
        loss_mask: Tensor | None = None,
        padding_mask=None,
        output_processor=None,
        output_processor_context=None,
    ) -> Tensor:
        """input_ids/position_ids [b, s], attention_mask bool [b|1, 1, s, s] (True = masked) or
        None (causal) -> logits [b, s, V/tp], or loss [b, s] fp32 when labels [b, s] are given,
        or hidden states [s, b, h] on stages without post_process.

        `packed_seq_params` (gigatron.core.packed_seq_params.PackedSeqParams, thd): b = 1 and
        the row holds several documents; none attends to another, RoPE restarts at each (pass
        position_ids restarting too for learned positions). docs/packed_sequences.md.

        `output_processor` (Megatron 0.19+): on the last stage, called instead of the output
        layer and loss with keyword arguments hidden_states [s(/tp), b, h], output_layer,
        output_weight (the tied embedding weight or None), labels, loss_mask, input_ids,
        position_ids, attention_mask, decoder_input, inference_context, packed_seq_params,
        runtime_gather_output, context (= `output_processor_context`),
        compute_language_model_loss, scale_logits (identity: no muP) and config; its result is
        the model's output."""
        check_attention_mask(attention_mask)  # before the embedding's collectives
        for name, ids in (("input_ids", input_ids), ("position_ids", position_ids),
                          ("labels", labels)):  # fmt: skip
            _check_integer_ids(name, ids)
        inference_context = inference_context if inference_context is not None else inference_params
        if inference_context is not None:  # KV-cache decoding: positions continue the cache
            position_ids = _inference_position_ids(self, inference_context, input_ids, position_ids)
        if decoder_input is None and self.pre_process:
            decoder_input = self.embedding(input_ids=input_ids, position_ids=position_ids)
        rotary_pos_emb = self._rotary_pos_emb_for(
            self.decoder, decoder_input, inference_context, packed_seq_params
        )
        hidden_states = self.decoder(
            hidden_states=decoder_input,
            attention_mask=attention_mask,
            rotary_pos_emb=rotary_pos_emb,
            inference_context=inference_context,
            packed_seq_params=packed_seq_params,
            **(extra_block_kwargs or {}),
        )  # [s(/tp), b, h]
        run_mtp = self.config.mtp_num_layers and inference_context is None  # not when decoding
        if run_mtp and self.mtp_process:
            hidden_states = self.mtp(
                input_ids=input_ids,
                position_ids=position_ids,
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                rotary_pos_emb=rotary_pos_emb,
                packed_seq_params=packed_seq_params,
                embedding=self.embedding,
            )  # [(1+D) s(/tp), b, h]
        if not self.post_process:
            return hidden_states
        if run_mtp:  # the MTP losses ride on the decoder's hidden states [s(/tp), b, h]
            hidden_states = self._process_mtp_loss(
                hidden_states, labels, loss_mask, input_ids, packed_seq_params
            )
        if output_processor is None:
            if inference_context is not None and not self.training:
                hidden_states = _last_token_only(hidden_states, inference_context)
            return self._output_and_loss(hidden_states, labels, loss_mask, runtime_gather_output)
        # Megatron 0.19 API: the caller's processor replaces the output layer and the loss
        return output_processor(
            hidden_states=hidden_states,
            output_layer=self.output_layer,
            output_weight=self._tied_output_weight(),
            labels=labels,
            loss_mask=loss_mask,
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            decoder_input=decoder_input,
            inference_context=inference_context,
            packed_seq_params=packed_seq_params,
            runtime_gather_output=runtime_gather_output,
            context=output_processor_context,
            compute_language_model_loss=self.compute_language_model_loss,
            scale_logits=_identity,
            config=self.config,
        )

    def _process_mtp_loss(self, hidden_states, labels, loss_mask, input_ids, packed_seq_params):
        """`process_mtp_loss` with this model's output layer and loss. The MTP logits stay
        vocab-parallel whatever runtime_gather_output says, as the main loss's do."""
        cp_group = (
            parallel_state.get_context_parallel_group()
            if parallel_state.model_parallel_is_initialized()
            else None
        )
        return process_mtp_loss(
            hidden_states=hidden_states, labels=labels, loss_mask=loss_mask,
            output_layer=self.output_layer, output_weight=self._tied_output_weight(),
            runtime_gather_output=False, is_training=self.training,
            compute_language_model_loss=self.compute_language_model_loss, config=self.config,
            cp_group=cp_group, tp_group=self.output_layer.tp_group,
            packed_seq_params=packed_seq_params, input_ids=input_ids,
        )  # fmt: skip

    def _output_and_loss(self, hidden_states, labels, loss_mask, runtime_gather_output) -> Tensor:
        """hidden_states [s(/tp), b, h] -> logits [b, s, V/tp], or with labels [b, s] the fp32
        loss [b, s]. The loss kernel follows cross_entropy_loss_fusion / cross_entropy_fusion_impl
        alone, whatever parallel_output is, as Megatron's compute_language_model_loss picks it."""
        output_weight = self._tied_output_weight()
        softcap = self.config.final_logit_softcapping
        if labels is None or not self.config.cross_entropy_loss_fusion or softcap:
            # With labels the loss is taken over the vocab-parallel logits, never gathered ones:
            # vocab_parallel_cross_entropy would read gathered [s, b, V] logits as a V-wide shard
            # per rank and return loss + log(tp) (Megatron does; gigatron differs on purpose).
            gather = False if labels is not None else runtime_gather_output
            logits, _ = self.output_layer(
                hidden_states, weight=output_weight, runtime_gather_output=gather
            )  # [s, b, V/tp]
            # Gemma 2: cap * tanh(logits / cap), elementwise, so on each vocabulary shard; the
            # fused loss path never forms the logits and is skipped.
            logits = logit_softcapping(logits, softcap)
            if labels is None:
                return logits.transpose(0, 1).contiguous()  # [b, s, V/tp]
            return self.compute_language_model_loss(labels, logits)  # [b, s]
        return self._fused_output_and_loss(hidden_states, output_weight, labels, loss_mask)

    def _fused_output_and_loss(self, hidden_states, output_weight, labels, loss_mask) -> Tensor:
        """Fast path of `_output_and_loss` with labels: output layer + vocab-parallel cross
        entropy in token chunks, never the whole batch's fp32 logits (same numbers as the plain
        path). The logits are recomputed chunk by chunk in backward: on H200 faster and smaller
        than keeping them (bench/reports/gpt-1gpu-throughput.md; under torch.compile AOT autograd
        merges the recompute with the forward matmul: bench/gpt/count_ce_matmuls.py); the chunked
        kernel reads the vocab-parallel weight and returns no logits to gather."""
        # 'native_grad_in_forward' (gigatron-only): both gradients in forward, one logits
        # matmul fewer; the loss gradient must be proportional to loss_mask.
        grad_in_forward = self.config.cross_entropy_fusion_impl == "native_grad_in_forward"
        return chunked_linear_cross_entropy(
            hidden_states,
            self.output_layer.weight if output_weight is None else output_weight,
            labels,
            sequence_parallel=self.config.sequence_parallel,
            recompute=True,
            grad_in_forward=grad_in_forward,
            loss_mask=loss_mask if grad_in_forward else None,
        )  # [b, s]

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """megatron-core's: {state-dict key: ShardedTensor | ShardedTensorFactory |
        ShardedObject}, stacked decoder layers (`TransformerBlock.sharded_state_dict`), without
        the output layer's empty `_extra_state` (megatron-core's GPT checkpoints hold none)."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        sharded.pop(f"{prefix}output_layer._extra_state", None)
        return sharded


def _check_mtp_placement(model, config) -> None:
    """One-line errors for MTP settings that would compute something else silently."""
    if model.post_process and config.mtp_num_layers and not model.mtp_process:
        raise ValueError(
            f"mtp_num_layers ({config.mtp_num_layers}) is set but this last stage got no "
            "mtp_block_spec: pass get_gpt_mtp_block_spec(config, layer_spec, ...) as "
            "GPTModel(mtp_block_spec=...)"
        )
    if model.mtp_process and not model.pre_process:
        if model.position_embedding_type == "learned_absolute":
            raise ValueError(
                "multi-token prediction on a pipeline stage without pre_process needs "
                "position_embedding_type 'rope' or 'none' (got 'learned_absolute': that stage's "
                "copy of the position table would train apart from the first stage's)"
            )


def _inference_position_ids(model, inference_context, input_ids, position_ids):
    """Positions of the new tokens under a KV cache: offset .. offset+s-1 unless given."""
    if model.config.sequence_parallel:
        raise ValueError(
            "inference_context needs sequence_parallel (True) off: one decoded token cannot be "
            "split over TP ranks"
        )
    if position_ids is not None or input_ids is None:
        return position_ids
    start = inference_context.sequence_len_offset
    positions = torch.arange(start, start + input_ids.shape[1], device=input_ids.device)
    return positions[None].expand(input_ids.shape[0], -1)  # [b, s]


def _last_token_only(hidden_states: Tensor, inference_context) -> Tensor:
    """[s, b, h] -> [1, b, h] when the cache asks for the last token's logits only (all a
    sampler needs)."""
    if inference_context.materialize_only_last_token_logits:
        return hidden_states[-1:]
    return hidden_states


def _identity(logits: Tensor) -> Tensor:
    """`scale_logits` handed to an output_processor: muP's logit scaling is not implemented."""
    return logits

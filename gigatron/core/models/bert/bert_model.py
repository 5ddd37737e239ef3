"""BERT: embedding (word + position + tokentype) -> bidirectional TransformerBlock -> LM head
(dense, gelu, layer norm, vocab projection with bias) and the binary (next-sentence) head.

Mirrors `megatron.core.models.bert.bert_model.BertModel`: same constructor, forward and module
names, so `state_dict()` keys are Megatron's (`embedding.word_embeddings.weight`,
`encoder.layers.{i}.self_attention.linear_qkv.weight`, `encoder.final_layernorm.weight`,
`lm_head.dense.weight`, `lm_head.layer_norm.weight`, `output_layer.bias`, `pooler.dense.weight`,
`binary_head.weight`, ...). The attention mask is Megatron's: `attention_mask` [b, s] (1 = real
token) becomes the bool [b, 1, s, s] mask `not (m_i and m_j)`, True = masked.

Shapes: b: micro-batch, s: seq, h: hidden, V: (padded) vocabulary, tp: tensor-parallel size.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core.layout_invariant_init import init_rng_scope
from gigatron.core.models.bert.bert_lm_head import BertLMHead
from gigatron.core.models.bert.pooler import Pooler, get_linear_layer
from gigatron.core.models.common.embeddings.language_model_embedding import (  # noqa: F401
    LanguageModelEmbedding,  # megatron-core's module exposes it here (docs/compat.md)
)
from gigatron.core.models.common.embeddings.rotary_pos_embedding import (  # noqa: F401
    RotaryEmbedding,
)
from gigatron.core.models.common.language_module.language_module import LanguageModule
from gigatron.core.transformer.dot_product_attention import DotProductAttention
from gigatron.core.transformer.enums import AttnBackend, ModelType
from gigatron.core.transformer.transformer_block import TransformerBlock

_POSITION_TYPES = ("learned_absolute", "rope")


class BertModel(LanguageModule):
    """Encoder-only transformer with masked-LM and (optionally) next-sentence heads."""

    def __init__(
        self,
        config,
        num_tokentypes: int,
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
        seq_len_interpolation_factor: float | None = None,
        add_binary_head: bool = True,
        return_embeddings: bool = False,
        vp_stage: int | None = None,
        pg_collection=None,
        apply_lm_head: bool = True,
        output_layer_bias: bool = True,
    ) -> None:
        super().__init__(config)
        # checks and stores vocab_size .. position_embedding_type (Megatron-named arguments)
        self._set_language_model_args(locals(), _POSITION_TYPES)
        if return_embeddings and not (post_process and add_binary_head):
            raise ValueError("return_embeddings=True needs post_process and add_binary_head")
        self.transformer_layer_spec = transformer_layer_spec
        self.add_binary_head = add_binary_head
        self.return_embeddings = return_embeddings
        # apply_lm_head=False: logits straight from the encoder output (models with their own
        # final norm), no dense + GeLU + LayerNorm transform.
        self.apply_lm_head, self.output_layer_bias = apply_lm_head, output_layer_bias
        self.vp_stage = vp_stage
        self.model_type = ModelType.encoder_or_decoder
        self.attn_mask_dimensions = self._sanity_check_attention_and_get_attn_mask_dimension()

        if pre_process:
            self._build_embedding(num_tokentypes=num_tokentypes)
        if position_embedding_type == "rope":
            self._build_rotary_pos_emb(rotary_percent, seq_len_interpolation_factor)
        self.encoder = TransformerBlock(
            config=config,
            spec=transformer_layer_spec,
            pre_process=pre_process,
            post_process=post_process,
            vp_stage=vp_stage,
        )
        if post_process:
            self._build_heads(config, add_binary_head)
        if pre_process or post_process:
            self.setup_embeddings_and_output_layer()

    def _sanity_check_attention_and_get_attn_mask_dimension(self) -> str:
        """Layout of the self-attention mask the encoder takes: "b1ss" ([b, 1, s, s]).

        Megatron's rule for its own (local) core attention: config.attention_backend must be
        local or auto, else ValueError. gigatron's stand-in for the TE spec (SDPA) takes the same
        [b, 1, s, s] padding mask, so no Transformer Engine version decides anything here."""
        attention = self.transformer_layer_spec.submodules.self_attention.submodules
        backend = self.config.attention_backend
        if attention.core_attention is DotProductAttention and backend not in (
            AttnBackend.local,
            AttnBackend.auto,
        ):
            raise ValueError(
                f"Expected AttnBackend to be local or auto while using mcore self attention, but "
                f"found {backend}. Set --attn-backend to local or dont use MCore SelfAttention "
                "submodule in layer specs"
            )
        return "b1ss"

    def _build_heads(self, config, add_binary_head: bool) -> None:
        """LM head (unless apply_lm_head=False), output layer (bias unless output_layer_bias=False)
        and, optionally, pooler + binary head."""
        # One init scope per piece: the output layer allocates a weight only on stages without
        # the (tied) embedding, which must not shift the other heads' random draws
        # (`_build_output_layer` opens the output layer's own scope).
        self.lm_head = None
        if self.apply_lm_head:
            with init_rng_scope(config, "lm_head"):
                self.lm_head = BertLMHead(config.hidden_size, config)
        self._build_output_layer(bias=self.output_layer_bias)
        self.binary_head = None
        if add_binary_head:
            with init_rng_scope(config, "binary_head"):
                self.binary_head = get_linear_layer(
                    config.hidden_size, 2, config.init_method, config.perform_initialization
                )
                self.pooler = Pooler(
                    config.hidden_size, config.init_method, config, config.sequence_parallel
                )

    @staticmethod
    def bert_extended_attention_mask(attention_mask: Tensor) -> Tensor:
        """attention_mask [b, s] (1 = token, 0 = pad) -> bool [b, 1, s, s], True = masked: a
        pair is kept only when both the query and the key are real tokens."""
        pair = attention_mask.unsqueeze(1) * attention_mask.unsqueeze(2)  # [b, s, s]
        return pair.unsqueeze(1) < 0.5  # [b, 1, s, s]

    @staticmethod
    def bert_position_ids(token_ids: Tensor) -> Tensor:
        """[b, s] -> positions 0..s-1 broadcast to [b, s]."""
        positions = torch.arange(token_ids.size(1), dtype=torch.long, device=token_ids.device)
        return positions.unsqueeze(0).expand_as(token_ids)

    def set_input_tensor(self, input_tensor) -> None:
        """Pipeline input of this stage (a one-element list is accepted, as in Megatron)."""
        self._set_block_input_tensor(self.encoder, input_tensor)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        tokentype_ids: Tensor | None = None,
        lm_labels: Tensor | None = None,
        inference_context=None,
        *,
        inference_params=None,
    ):
        """input_ids/tokentype_ids [b, s], attention_mask [b, s] (1 = token) ->
        (logits [b, s, V/tp] or, with lm_labels [b, s], fp32 loss [b, s]; binary logits [b, 2]
        or None). Stages without post_process return hidden states [s, b, h]."""
        extended_mask = self.bert_extended_attention_mask(attention_mask)  # [b, 1, s, s]
        encoder_input = None
        if self.pre_process:
            position_ids = self.bert_position_ids(input_ids)
            encoder_input = self.embedding(
                input_ids=input_ids, position_ids=position_ids, tokentype_ids=tokentype_ids
            )  # [s, b, h]
        hidden_states = self.encoder(
            hidden_states=encoder_input,
            attention_mask=extended_mask,
            rotary_pos_emb=self._rotary_pos_emb_for(self.encoder, encoder_input),
        )  # [s(/tp), b, h]
        if not self.post_process:
            return hidden_states
        pooled = self.pooler(hidden_states, 0) if self.add_binary_head else None  # [b, h]
        if self.return_embeddings:
            return _mean_embeddings(hidden_states, attention_mask)
        output_weight = self._tied_output_weight()
        transformed = hidden_states  # [s, b, h]
        if self.lm_head is not None:
            transformed = self.lm_head(hidden_states=hidden_states)
        # With lm_labels the loss is taken over the vocab-parallel logits, never gathered ones:
        # vocab_parallel_cross_entropy would read gathered [s, b, V] logits as a V-wide shard
        # per rank and return loss + log(tp) (Megatron does; gigatron differs on purpose).
        gather = False if lm_labels is not None else None  # None: parallel_output decides
        logits, _ = self.output_layer(
            transformed, weight=output_weight, runtime_gather_output=gather
        )  # [s, b, V/tp] (V when returned with parallel_output=False)
        binary_logits = self.binary_head(pooled) if self.binary_head is not None else None
        if lm_labels is None:
            return logits.transpose(0, 1).contiguous(), binary_logits  # [b, s, V/tp], [b, 2]
        return self.compute_language_model_loss(lm_labels, logits), binary_logits


def _mean_embeddings(hidden_states: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of each sequence's hidden states without its first and last real token ([CLS],
    [SEP]), as Megatron's return_embeddings. [s, b, h] -> fp32 [b, h]."""
    embeddings = hidden_states.transpose(0, 1)  # [b, s, h]
    lengths = attention_mask.sum(dim=1)  # [b]
    rows = [emb[1 : int(n) - 1].float().mean(dim=0) for emb, n in zip(embeddings, lengths)]
    return torch.stack(rows)

"""T5: a shared embedding feeding a bidirectional encoder and a causal decoder with cross
attention to the encoder output, then the LM head.

Mirrors `megatron.core.models.T5.t5_model` (T5Model, T5LMHead, t5_extended_attention_mask,
t5_position_ids): same constructor, forward, masks (bool, True = masked; the local layers take
[b, 1, sq, sk] masks) and module names, so `state_dict()` keys are Megatron's
(`embedding.word_embeddings.weight`, `encoder.layers.{i}.*`, `decoder.layers.{i}.cross_attention.
linear_q.weight`, `lm_head.output_layer.bias`, ...); checkpoints use megatron-core's stacked keys.

Pipeline parallelism splits the model between encoder and decoder (Megatron's encoder-decoder
split): a stage built with add_decoder=False runs the whole encoder and sends its output; a stage
built with add_encoder=False receives it as `set_input_tensor([encoder_output])` and runs the
decoder (embedding its own decoder tokens: pre_process=True there too, the word embedding shared
with the encoder stage through the embedding group, the position embedding through the
position-embedding group, which must then list both stages: pretrain_t5 passes
`get_position_embedding_ranks`). PP must be 2 then; each stack is whole on its stage.

Position embedding type 'relative' adds `RelativePositionEmbedding`'s bias to every
self-attention's scores (gigatron's DotProductAttention takes attention_bias; Megatron needs
Transformer Engine for it).

Shapes: b: micro-batch, se / sd: encoder / decoder seq, h: hidden, V: (padded) vocabulary.
"""

from __future__ import annotations

import contextlib
import copy
import zlib

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.core import layout_invariant_init, parallel_state, tensor_parallel
from gigatron.core.layout_invariant_init import init_rng_scope
from gigatron.core.models.common.embeddings.language_model_embedding import (  # noqa: F401
    LanguageModelEmbedding,  # megatron-core's module exposes it here (docs/compat.md)
)
from gigatron.core.models.common.embeddings.rotary_pos_embedding import (  # noqa: F401
    RotaryEmbedding,
)
from gigatron.core.models.common.language_module.language_module import (
    LanguageModule,
    move_to_collective_device,
)
from gigatron.core.packed_seq_params import PackedSeqParams  # noqa: F401  (Megatron's name here)
from gigatron.core.transformer.enums import ModelType
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.transformer_block import TransformerBlock

_POSITION_TYPES = ("learned_absolute", "rope", "relative")


class T5LMHead(MegatronModule):
    """Decoder hidden states [sd, b, h] -> logits [sd, b, V/tp]. With tied weights the layer has
    a bias and borrows the word-embedding weight (Megatron's arrangement)."""

    def __init__(
        self,
        config,
        parallel_output: bool,
        vocab_size: int,
        pre_process: bool = True,
        share_embeddings_and_output_weights: bool = False,
        tp_group=None,
    ):
        super().__init__(config)

        self.parallel_output = parallel_output
        self.output_layer = tensor_parallel.ColumnParallelLinear(
            config.hidden_size,
            vocab_size,
            config=config,
            init_method=config.init_method,
            bias=share_embeddings_and_output_weights,
            skip_bias_add=not share_embeddings_and_output_weights,
            gather_output=not parallel_output,
            skip_weight_param_allocation=pre_process and share_embeddings_and_output_weights,
        )

    def forward(
        self,
        hidden_states: Tensor,
        word_embeddings_weight: Tensor | None,
        runtime_gather_output: bool | None = None,
    ) -> Tensor:
        """[sd, b, h] -> [sd, b, V/tp], or [sd, b, V] when gathered (`runtime_gather_output`,
        else `not parallel_output`)."""
        logits, _ = self.output_layer(
            hidden_states,
            weight=word_embeddings_weight,
            runtime_gather_output=runtime_gather_output,
        )
        return logits


class T5Model(LanguageModule):
    """Encoder-decoder transformer language model (Megatron's T5)."""

    def __init__(
        self,
        config,
        encoder_config,
        transformer_encoder_layer_spec,
        transformer_decoder_layer_spec,
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
        relative_attention_num_buckets: int = 32,
        relative_attention_max_distance: int = 128,
        add_encoder: bool = True,
        add_decoder: bool = True,
        pg_collection=None,
    ) -> None:
        super().__init__(config)
        # checks and stores vocab_size .. position_embedding_type (Megatron-named arguments)
        self._set_language_model_args(locals(), _POSITION_TYPES)
        # Neither stack (Megatron allows it: add_encoder / add_decoder None): the embeddings and
        # the LM head only, e.g. to save or load them; forward then refuses.
        add_encoder, add_decoder = bool(add_encoder), bool(add_decoder)
        self.encoder_config = encoder_config
        self.transformer_encoder_layer_spec = transformer_encoder_layer_spec
        self.transformer_decoder_layer_spec = transformer_decoder_layer_spec
        self.add_encoder, self.add_decoder = add_encoder, add_decoder
        self.encoder_hidden_state = None
        self.model_type = ModelType.encoder_or_decoder
        self.xattn_needed = True

        self.position_embeddings = None
        if pre_process:
            self._build_embedding()
            if position_embedding_type == "learned_absolute":
                self.position_embeddings = self.embedding.position_embeddings
        if position_embedding_type == "rope":
            self._build_rotary_pos_emb(rotary_percent, seq_len_interpolation_factor)
        if position_embedding_type == "relative":
            from gigatron.core.models.T5.relative_pos_embedding import RelativePositionEmbedding

            with init_rng_scope(config, "relative_pos_emb"):
                self.encoder_relative_pos_emb, self.decoder_relative_pos_emb = (
                    RelativePositionEmbedding(
                        bidirectional=bidirectional,
                        init_method=config.init_method,
                        num_attention_heads=config.num_attention_heads,
                        relative_attention_num_buckets=relative_attention_num_buckets,
                        relative_attention_max_distance=relative_attention_max_distance,
                    )
                    for bidirectional in (True, False)
                )
        split = config.pipeline_model_parallel_size > 1 and not (add_encoder and add_decoder)
        if split and config.pipeline_model_parallel_size != 2:
            raise ValueError(
                f"pipeline_model_parallel_size ({config.pipeline_model_parallel_size}) must be 2 "
                "for T5Model's encoder/decoder split (encoder stage, decoder stage) (t5_model.py)"
            )
        if split and position_embedding_type == "relative":
            # Each stage keeps only its stack's table (built both, so init matches PP = 1): an
            # unused copy would drift under weight decay and be saved twice.
            if not add_encoder:
                self.encoder_relative_pos_emb = None
            if not add_decoder:
                self.decoder_relative_pos_emb = None
        self.encoder = None
        if add_encoder:
            # Under the encoder/decoder pipeline split the encoder ends on its stage: it keeps
            # its final norm even where the stage has no post_process.
            self.encoder = TransformerBlock(
                config=_whole_stack_config(encoder_config) if split else encoder_config,
                spec=transformer_encoder_layer_spec,
                pre_process=pre_process,
                post_process=post_process or not add_decoder,
            )
        self.decoder = None
        if add_decoder:
            with _stack_init_seed("decoder"):
                self.decoder = TransformerBlock(
                    config=_whole_stack_config(config) if split else config,
                    spec=transformer_decoder_layer_spec,
                    pre_process=pre_process,
                    post_process=post_process,
                )
        if post_process:
            with init_rng_scope(config, "output_layer"):
                self.lm_head = T5LMHead(
                    config,
                    parallel_output,
                    vocab_size,
                    pre_process,
                    share_embeddings_and_output_weights,
                )
            self.output_layer = self.lm_head.output_layer
        if pre_process or post_process:
            self.setup_embeddings_and_output_layer()

    def setup_embeddings_and_output_layer(self) -> None:
        """Megatron's tying, plus the encoder/decoder split: both stages embed tokens, so their
        word and position embeddings start equal (the encoder stage's copies, broadcast over
        the embedding / position-embedding group) and are flagged `shared_embedding`;
        finalize_model_grads sums their grads over those groups. The decoder stage's copies
        are also `shared` (like the last stage's tied output weight), so the grad norm counts
        each table once."""
        split = self.config.pipeline_model_parallel_size > 1 and self.pre_process
        if not split:
            super().setup_embeddings_and_output_layer()
            return
        self.embedding.word_embeddings.weight.is_embedding_or_output_parameter = True
        if self.post_process and self.share_embeddings_and_output_weights:
            # the decoder stage embeds and projects with one table: the LM head's fused wgrad
            # returns zeros so the lookup's grad in .grad is still added (Megatron's rule)
            self.shared_embedding_or_output_weight().zero_out_wgrad = True
        in_groups = dist.is_initialized() and parallel_state.model_parallel_is_initialized()
        for weight, in_group, get_group in self._split_shared_weights():
            weight.shared_embedding = True
            if not self.add_encoder:
                weight.shared = True
            if in_groups and in_group():
                group = get_group()
                move_to_collective_device(weight, group)
                with torch.no_grad():
                    dist.broadcast(weight.data, dist.get_global_rank(group, 0), group=group)

    def _split_shared_weights(self) -> list:
        """(weight, is this rank in its group, the group getter) for each table both split
        stages hold."""
        weights = [
            (
                self.embedding.word_embeddings.weight,
                parallel_state.is_rank_in_embedding_group,
                parallel_state.get_embedding_group,
            )
        ]
        if self.position_embeddings is not None:
            weights.append(
                (
                    self.position_embeddings.weight,
                    parallel_state.is_rank_in_position_embedding_group,
                    parallel_state.get_position_embedding_group,
                )
            )
        return weights

    def _relative_bias(self, which: str, ids: Tensor) -> Tensor | None:
        """This TP rank's heads of the relative position bias [1, np/tp, s, s] (or None)."""
        if self.position_embedding_type != "relative":
            return None

        emb = getattr(self, f"{which}_relative_pos_emb")
        bias = emb(ids.size(1), ids.size(1)).permute(0, 2, 3, 1)  # [1, s, s, np]
        # Split the heads over TP (backward all-gathers: the table's grad is whole on each rank).
        bias = tensor_parallel.scatter_to_tensor_model_parallel_region(bias)  # [1, s, s, np/tp]
        return bias.permute(0, 3, 1, 2)  # [1, np/tp, s, s]

    def set_input_tensor(self, input_tensor) -> None:
        """Encoder stage: its pipeline input. Decoder-only stage: [encoder output] or
        [decoder input, encoder output]."""
        if not isinstance(input_tensor, list):
            input_tensor = [input_tensor]
        if self.add_encoder:
            if len(input_tensor) != 1:
                raise ValueError(f"encoder stage expects one input tensor, got {len(input_tensor)}")
            self.encoder.set_input_tensor(input_tensor[0])
            return
        if len(input_tensor) == 2:
            self.decoder.set_input_tensor(input_tensor[0])
            self.encoder_hidden_state = input_tensor[1]
        elif len(input_tensor) == 1:
            self.decoder.set_input_tensor(None)
            self.encoder_hidden_state = input_tensor[0]
        else:
            raise ValueError(f"decoder stage expects 1 or 2 input tensors, got {len(input_tensor)}")

    def forward(
        self,
        encoder_input_ids: Tensor,
        decoder_input_ids: Tensor,
        encoder_attn_mask: Tensor | None,
        decoder_attn_mask: Tensor | None,
        encoder_decoder_attn_mask: Tensor | None,
        lm_labels: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        output_encoder_hidden_only: bool = False,
        inference_context=None,
        packed_seq_params=None,
        *,
        inference_params=None,
    ) -> Tensor:
        """ids [b, se] / [b, sd]; masks bool [b, 1, se, se], [b, 1, sd, sd], [b, 1, sd, se]
        (True = masked) -> logits [b, sd, V/tp], or fp32 loss [b, sd] with lm_labels [b, sd];
        the encoder output [se, b, h] on encoder-only stages or with output_encoder_hidden_only;
        decoder hidden states [sd, b, h] on decoder stages without post_process."""
        if packed_seq_params is not None:
            raise ValueError("packed_seq_params is not supported by gigatron's T5Model")
        if not (self.add_encoder or self.add_decoder):
            raise ValueError(
                "T5Model.forward: this model was built with add_encoder and add_decoder False "
                "(embeddings and LM head only); build it with either stack to run it"
            )
        if encoder_hidden_states is None:
            if self.add_encoder:
                encoder_input = None
                if self.pre_process:
                    encoder_input = self.embedding(
                        input_ids=encoder_input_ids,
                        position_ids=t5_position_ids(encoder_input_ids),
                    )  # [se, b, h]
                encoder_hidden_states = self.encoder(
                    hidden_states=encoder_input,
                    attention_mask=encoder_attn_mask,
                    rotary_pos_emb=self._rotary_pos_emb_for(self.encoder, encoder_input),
                    attention_bias=self._relative_bias("encoder", encoder_input_ids),
                )  # [se, b, h]
            else:
                encoder_hidden_states = self.encoder_hidden_state
        if not self.add_decoder or output_encoder_hidden_only:
            return encoder_hidden_states
        decoder_input = None
        if self.pre_process:
            decoder_input = self.embedding(
                input_ids=decoder_input_ids, position_ids=t5_position_ids(decoder_input_ids)
            )  # [sd, b, h]
        decoder_hidden_states = self.decoder(
            hidden_states=decoder_input,
            attention_mask=decoder_attn_mask,
            context=encoder_hidden_states,
            context_mask=encoder_decoder_attn_mask,
            rotary_pos_emb=self._rotary_pos_emb_for(self.decoder, decoder_input),
            attention_bias=self._relative_bias("decoder", decoder_input_ids),
        )  # [sd, b, h]
        if not self.post_process:
            return decoder_hidden_states
        output_weight = self._tied_output_weight()
        # With lm_labels the loss is taken over the vocab-parallel logits, never gathered ones:
        # vocab_parallel_cross_entropy would read gathered [sd, b, V] logits as a V-wide shard
        # per rank and return loss + log(tp) (Megatron does; gigatron differs on purpose).
        gather = False if lm_labels is not None else None  # None: parallel_output decides
        logits = self.lm_head(
            decoder_hidden_states,
            word_embeddings_weight=output_weight,
            runtime_gather_output=gather,
        )  # [sd, b, V/tp] (V when returned with parallel_output=False)
        if lm_labels is None:
            return logits.transpose(0, 1).contiguous()  # [b, sd, V/tp]
        return self.compute_language_model_loss(lm_labels, logits)  # [b, sd]

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """megatron-core's (LanguageModule's): both stacks stacked (`encoder.layers.<name>`
        [L_enc, ...], `decoder.layers.<name>` [L_dec, ...]), the modules megatron-core
        registers twice (`position_embeddings`, `output_layer`) under both names. Under the
        encoder/decoder pipeline split the decoder stage's embedding tables are non-main
        copies (replica id (1, ., .)) of the encoder stage's.

        `metadata={"legacy_layout": True}`: the layout of gigatron's T5 checkpoints before
        this one (encoder layers under per-layer keys, no encoder or output-layer
        `_extra_state`, no second names), to load such a checkpoint."""
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        if (metadata or {}).get("legacy_layout", False):
            sharded = _legacy_layout(self, sharded, prefix, metadata)
        on_first_stage = not parallel_state.model_parallel_is_initialized() or (
            parallel_state.is_pipeline_first_stage(ignore_virtual=True)
        )
        if not on_first_stage:
            for key, sh in sharded.items():
                if key.startswith((f"{prefix}embedding.", f"{prefix}position_embeddings.")):
                    sh.replica_id = (1, *sh.replica_id[1:])
        return sharded


def _legacy_layout(model, sharded: dict, prefix: str, metadata) -> dict:
    """`sharded` (the current layout) rewritten to the older gigatron T5 layout."""
    encoder = f"{prefix}encoder."
    out = {k: v for k, v in sharded.items() if not k.startswith(encoder)}
    if model.encoder is not None:
        per_layer = {**metadata, "non_homogeneous_layers": True}
        out.update(model.encoder.sharded_state_dict(encoder, (), per_layer))
    aliases = (f"{prefix}position_embeddings.", f"{prefix}output_layer.")
    return {
        k: v
        for k, v in out.items()
        if not k.startswith(aliases)
        and not (k.endswith("._extra_state") and not k.startswith(f"{prefix}decoder."))
    }


def _whole_stack_config(config):
    """A shallow copy of `config` whose pipeline layer split puts all `num_layers` on this
    stage (none on the other): under the encoder/decoder split each stage holds its stack
    whole, so its layers number (and seed) from 1 as at PP = 1, whatever the stage."""
    stage = parallel_state.get_pipeline_model_parallel_rank()
    config = copy.copy(config)
    config.virtual_pipeline_model_parallel_size = None
    config.account_for_embedding_in_pipeline_split = False
    config.account_for_loss_in_pipeline_split = False
    config.num_layers_in_first_pipeline_stage = config.num_layers if stage == 0 else 0
    config.num_layers_in_last_pipeline_stage = config.num_layers if stage == 1 else 0
    return config


@contextlib.contextmanager
def _stack_init_seed(name: str):
    """Under layout-invariant init, layers are seeded by global layer number; give the decoder
    its own base seed so decoder layer i does not start as a copy of encoder layer i."""
    base = layout_invariant_init.get_layout_invariant_init_seed()
    if base is None:
        yield
        return
    layout_invariant_init.set_layout_invariant_init_seed(
        zlib.crc32(f"{base}:{name}".encode()) & 0x7FFFFFFF
    )
    try:
        yield
    finally:
        layout_invariant_init.set_layout_invariant_init_seed(base)


def t5_extended_attention_mask(attention_mask_list: list) -> list:
    """[b, sq, sk] masks -> [b, 1, sq, sk] (None stays None)."""
    return [m.unsqueeze(1) if m is not None else None for m in attention_mask_list]


def t5_position_ids(token_ids: Tensor) -> Tensor:
    """[b, s] -> positions 0..s-1 broadcast to [b, s]."""
    positions = torch.arange(token_ids.size(1), dtype=torch.long, device=token_ids.device)
    return positions.unsqueeze(0).expand_as(token_ids)

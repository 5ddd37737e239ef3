"""Base of language models: LM loss and embedding/output-weight tying across pipeline stages.

Mirrors `megatron.core.models.common.language_module.language_module.LanguageModule`. With tied
weights and one pipeline stage the output layer reads the embedding weight directly; with several
stages the last stage holds its own copy, zeroed, and the first and last stages all-reduce it over
the embedding group so both start equal (finalize_model_grads keeps their grads equal later).
In checkpoints that copy is saved as Megatron does: under the word-embedding key, as a non-main
replica (replica id (1, 0, dp)) of the first stage's tensor.

gigatron also keeps here, as private helpers, the pieces GPTModel, BertModel and T5Model share
(constructor argument checks, `embedding`, `rotary_pos_emb`, `output_layer`, the one-block
`set_input_tensor`, the tied output weight): the attribute names are Megatron's, and the tying
methods below read them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.core import parallel_state, tensor_parallel
from gigatron.core.layout_invariant_init import init_rng_scope
from gigatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from gigatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from gigatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding
from gigatron.core.transformer.module import MegatronModule
from gigatron.core.transformer.multi_token_prediction import tie_word_embeddings_state_dict
from gigatron.core.utils import make_tp_sharded_tensor_for_checkpoint


class LanguageModule(MegatronModule):
    """MegatronModule with `compute_language_model_loss` and embedding tying."""

    def __init__(self, config, pg_collection=None):
        super().__init__(config)
        # The TP group the vocabulary is split over (None: parallel_state's, at call time).
        self.tp_group = getattr(pg_collection, "tp", None)
        self.vp_stage = None
        self.vp_size = config.virtual_pipeline_model_parallel_size

    def _set_language_model_args(self, args: dict, supported_position_types: tuple) -> None:
        """Check and store the constructor arguments every language model shares.

        `args`: the subclass constructor's `locals()`, read by Megatron's parameter names
        (vocab_size, max_sequence_length, pre_process, post_process, fp16_lm_cross_entropy,
        parallel_output, share_embeddings_and_output_weights, position_embedding_type), each
        stored as the attribute of that name."""
        self.vocab_size = args["vocab_size"]
        self.max_sequence_length = args["max_sequence_length"]
        self.pre_process, self.post_process = args["pre_process"], args["post_process"]
        self.fp16_lm_cross_entropy = args["fp16_lm_cross_entropy"]
        self.parallel_output = args["parallel_output"]
        self.share_embeddings_and_output_weights = args["share_embeddings_and_output_weights"]
        self.position_embedding_type = args["position_embedding_type"]
        name = type(self).__name__
        if self.position_embedding_type not in supported_position_types:
            raise ValueError(
                f"position_embedding_type ({self.position_embedding_type!r}) must be one of "
                f"{supported_position_types} for {name}"
            )
        tp = parallel_state.get_tensor_model_parallel_world_size()
        if self.vocab_size % tp != 0:
            raise ValueError(
                f"vocab_size ({self.vocab_size}) must be divisible by "
                f"tensor_model_parallel_size ({tp}) for {name}; "
                "pad it with gigatron.core.models.common.vocab_utils.vocab_size_with_padding"
            )

    def _build_embedding(self, **embedding_kwargs) -> None:
        """`self.embedding` (a LanguageModelEmbedding over this model's vocabulary, positions
        and position type; `embedding_kwargs`: num_tokentypes, scatter_to_sequence_parallel)."""
        with init_rng_scope(self.config, "embedding"):
            self.embedding = LanguageModelEmbedding(
                config=self.config,
                vocab_size=self.vocab_size,
                max_sequence_length=self.max_sequence_length,
                position_embedding_type=self.position_embedding_type,
                **embedding_kwargs,
            )

    def _build_rotary_pos_emb(
        self,
        rotary_percent: float,
        seq_len_interpolation_factor: float | None,
        rotary_base: int = 10000,
        rope_scaling: bool = False,
        rope_scaling_factor: float = 8.0,
    ) -> None:
        """`self.rotary_pos_emb` for position_embedding_type 'rope' (head dim: kv_channels)."""
        self.rotary_pos_emb = RotaryEmbedding(
            kv_channels=self.config.kv_channels,
            rotary_percent=rotary_percent,
            rotary_interleaved=self.config.rotary_interleaved,
            seq_len_interpolation_factor=seq_len_interpolation_factor,
            rotary_base=rotary_base,
            rope_scaling=rope_scaling,
            rope_scaling_factor=rope_scaling_factor,
            use_cpu_initialization=self.config.use_cpu_initialization,
        )

    def _build_yarn_rotary_pos_emb(
        self, rotary_percent: float, seq_len_interpolation_factor: float | None, rotary_base
    ) -> None:
        """`self.rotary_pos_emb` for position_embedding_type 'yarn': YaRN frequencies from the
        config's `yarn_*` fields (Megatron's GPTModel reads the same names off its config); the
        attention applies the concentration factor to cos/sin."""
        c = self.config
        self.rotary_pos_emb = YarnRotaryEmbedding(
            kv_channels=c.kv_channels,
            rotary_percent=rotary_percent,
            rotary_interleaved=c.rotary_interleaved,
            seq_len_interpolation_factor=seq_len_interpolation_factor,
            rotary_base=rotary_base,
            use_cpu_initialization=c.use_cpu_initialization,
            scaling_factor=c.yarn_rotary_scaling_factor,
            original_max_position_embeddings=c.yarn_original_max_position_embeddings,
            beta_fast=c.yarn_beta_fast,
            beta_slow=c.yarn_beta_slow,
            mscale=c.yarn_mscale,
            mscale_all_dim=c.yarn_mscale_all_dim,
            correction_range_round_to_int=c.yarn_correction_range_round_to_int,
        )

    def _build_output_layer(self, *, bias: bool) -> None:
        """`self.output_layer`: [s, b, h] -> [s, b, V/tp] (V with parallel_output=False); no
        weight of its own where it borrows the word embedding's (tied, on the first stage)."""

        with init_rng_scope(self.config, "output_layer"):
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                self.config.hidden_size,
                self.vocab_size,
                config=self.config,
                init_method=self.config.init_method,
                bias=bias,
                skip_bias_add=False,
                gather_output=not self.parallel_output,
                skip_weight_param_allocation=(self.pre_process or self._mtp_process())
                and self.share_embeddings_and_output_weights,
            )

    def _set_block_input_tensor(self, block, input_tensor) -> None:
        """`set_input_tensor` of a model with one TransformerBlock: `input_tensor` (or a
        one-element list of it, as in Megatron) is `block`'s pipeline input."""
        if not isinstance(input_tensor, list):
            input_tensor = [input_tensor]
        if len(input_tensor) != 1:
            raise ValueError(
                f"{type(self).__name__} expects one input tensor, got {len(input_tensor)}"
            )
        block.set_input_tensor(input_tensor[0])

    def _tied_output_weight(self) -> Tensor | None:
        """The weight the output layer uses in place of its own: the shared embedding/output
        weight [V/tp, h] with share_embeddings_and_output_weights, else None."""
        if self.share_embeddings_and_output_weights:
            return self.shared_embedding_or_output_weight()
        return None

    def _rotary_pos_emb_for(
        self, block, block_input: Tensor | None, inference_context=None, packed_seq_params=None
    ) -> Tensor | None:
        """RoPE angles [s, 1, 1, rot_dim] for `block` (a TransformerBlock) fed `block_input`
        [s(/tp), b, h] (or its pipeline input); None unless position_embedding_type is 'rope'
        (and None for multi-latent attention, which applies its own). With packed_seq_params the
        whole table, never split over CP ranks (attention picks each token's in-document
        position)."""
        kind = self.position_embedding_type
        if kind not in ("rope", "yarn") or (kind == "rope" and self.config.multi_latent_attention):
            return None
        seq_len = self.rotary_pos_emb.get_rotary_seq_len(
            inference_context, block, block_input, self.config
        )
        angles = self.rotary_pos_emb(seq_len, packed_seq=packed_seq_params is not None)
        return angles[0] if kind == "yarn" else angles  # yarn: (angles, concentration factor)

    def compute_language_model_loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """labels [b, s], logits [s, b, V/tp] -> per-token fp32 loss [b, s] (no mask, no mean)."""

        labels = labels.transpose(0, 1).contiguous()  # [s, b]
        # vocab_parallel_cross_entropy overwrites fp32 logits in place, as in Megatron: safe, the
        # output layer's backward needs its input and weight, not the logits.
        loss = tensor_parallel.vocab_parallel_cross_entropy(
            logits.float(), labels, tp_group=getattr(self, "tp_group", None)
        )
        return loss.transpose(0, 1).contiguous()  # [b, s]

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None) -> dict:
        """MegatronModule's, with the output weight (and bias) allowed to change padded
        vocabulary size, and the tied output weight of a later pipeline stage saved as a
        non-main copy of the first stage's word embedding."""
        if sharded_offsets:
            raise ValueError(
                f"{type(self).__name__}.sharded_state_dict: sharded_offsets ({sharded_offsets}) "
                "must be empty"
            )
        sharded = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        emb_key, out_key = (
            f"{prefix}embedding.word_embeddings.weight",
            f"{prefix}output_layer.weight",
        )
        if self._mtp_process() and not self.pre_process:
            tie_word_embeddings_state_dict(
                sharded, self.embedding.word_embeddings.weight, emb_key,
                tp_group=self.embedding.word_embeddings.tp_group,
                dp_cp_group=_dp_cp_group(metadata),
            )  # fmt: skip
        if self.share_embeddings_and_output_weights:
            self._tie_output_weight(sharded, out_key, emb_key, metadata)
        elif self.post_process:
            sharded[out_key].allow_shape_mismatch = True
        if self.post_process and f"{prefix}output_layer.bias" in sharded:
            sharded[f"{prefix}output_layer.bias"].allow_shape_mismatch = True
        return sharded

    def _tie_output_weight(self, sharded: dict, out_key: str, emb_key: str, metadata) -> None:
        """Megatron's `tie_embeddings_and_output_weights_state_dict`: on a last stage without
        the embedding, the output weight is saved under `emb_key` as replica (1, 0, dp)."""
        if not self.post_process or self.pre_process or self._mtp_process():
            return  # no output layer, or it reads the (first stage's / MTP copy of) embedding
        del sharded[out_key]
        dp_cp_group = _dp_cp_group(metadata)
        dp_rank = dist.get_rank(dp_cp_group) if dp_cp_group is not None else 0
        sharded[out_key] = make_tp_sharded_tensor_for_checkpoint(
            self.shared_embedding_or_output_weight(), emb_key, replica_id=(1, 0, dp_rank),
            allow_shape_mismatch=True, tp_group=self.output_layer.tp_group,
            dp_cp_group=dp_cp_group,
        )  # fmt: skip

    def _mtp_process(self) -> bool:
        """Whether this stage runs a multi-token-prediction block (GPTModel sets mtp_process),
        which holds a copy of the word embedding."""
        return bool(getattr(self, "mtp_process", False))

    def shared_embedding_or_output_weight(self) -> Tensor | None:
        """The word-embedding weight (first stage, or a stage running MTP, which holds a copy)
        or the output weight (last stage)."""
        if self.pre_process or self._mtp_process():
            return self.embedding.word_embeddings.weight
        if self.post_process:
            return self.output_layer.weight
        return None

    def setup_embeddings_and_output_layer(self) -> None:
        """Mark embedding/output params and tie them across pipeline stages when shared."""
        mtp = self._mtp_process()
        if self.pre_process or mtp:
            self.embedding.word_embeddings.weight.is_embedding_or_output_parameter = True
        if self.post_process and self.output_layer.weight is not None:
            self.output_layer.weight.is_embedding_or_output_parameter = True
        # Tied weights, or MTP's copy of the embedding on a later stage: keep the copies equal.
        if not self.share_embeddings_and_output_weights and not self.config.mtp_num_layers:
            return
        if self.config.pipeline_model_parallel_size == 1:
            self.shared_embedding_or_output_weight().zero_out_wgrad = True
            return
        first_chunk = self.vp_stage is None or self.vp_stage == 0
        if self.pre_process and not self.post_process and first_chunk:
            self.shared_embedding_or_output_weight().shared_embedding = True
        tied_copy = self.post_process and self.share_embeddings_and_output_weights
        if (tied_copy or mtp) and not self.pre_process:
            weight = self.shared_embedding_or_output_weight()
            # MTP's lookup and the tied output layer share it on this stage: as at PP = 1, the
            # fused output-layer wgrad must leave zeros so the lookup's .grad is added on top
            # (Megatron marks only PP = 1; without it the lookup's grad is dropped)
            weight.zero_out_wgrad = bool(mtp and tied_copy)
            weight.data.fill_(0)
            weight.shared = True
            weight.shared_embedding = True
        if dist.is_initialized() and parallel_state.model_parallel_is_initialized():
            if parallel_state.is_rank_in_embedding_group(
                ignore_virtual=False, vp_stage=self.vp_stage
            ):
                weight = self.shared_embedding_or_output_weight()
                if weight is not None:
                    group = parallel_state.get_embedding_group()
                    move_to_collective_device(weight, group)
                    with torch.no_grad():
                        dist.all_reduce(weight.data, group=group)


def _dp_cp_group(metadata):
    """The DP x CP group replicas are counted over: the metadata's, else parallel_state's."""
    group = (metadata or {}).get("dp_cp_group")
    if group is None and parallel_state.model_parallel_is_initialized():
        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    return group


def move_to_collective_device(weight: torch.Tensor, group) -> None:
    """A CPU-initialised weight (`use_cpu_initialization`) about to meet a group without a CPU
    backend (NCCL) moves to the current GPU first, as Megatron moves it before tying."""
    if weight.device.type == "cpu" and "gloo" not in str(dist.get_backend(group)):
        weight.data = weight.data.to(torch.device("cuda", torch.cuda.current_device()))

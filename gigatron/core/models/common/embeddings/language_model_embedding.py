"""Word + learned position embeddings with dropout, output in the transformer's [s, b, h] layout.

Mirrors `megatron.core.models.common.embeddings.language_model_embedding.LanguageModelEmbedding`.
Under sequence parallelism the output is split along s over TP ranks (via reduce-scatter inside
the vocab-parallel embedding when there are no position embeddings, else a scatter) and dropout
runs in the TP RNG fork. gigatron addition: token ids outside [0, vocab_size) raise ValueError
naming the id, instead of an out-of-bounds device assert.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core import tensor_parallel
from gigatron.core.transformer.module import MegatronModule

CHECK_INPUT_IDS = True  # module switch: False skips the one host sync of check_token_ids


def check_token_ids(
    input_ids: Tensor,
    vocab_size: int,
    position_ids: Tensor | None = None,
    max_sequence_length: int | None = None,
) -> None:
    """Raise ValueError naming the first id outside [0, vocab_size) (and the first position id
    outside [0, max_sequence_length) when given). One host sync per call for both checks.

    Skipped while torch.compile traces (a data-dependent branch would break the graph), on the
    meta device, and when `CHECK_INPUT_IDS` is False (benchmarks measuring a sync-free step).
    """
    if torch.compiler.is_compiling() or not CHECK_INPUT_IDS or input_ids.is_meta:
        return  # meta: a model traced for its shapes (gigatron estimate) has no ids to check
    stats = [torch.aminmax(input_ids)]
    if position_ids is not None:
        stats.append(torch.aminmax(position_ids))
    lo, hi, *pos_range = torch.stack([v for pair in stats for v in pair]).tolist()
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        pos = (input_ids == bad).nonzero()[0].tolist()
        raise ValueError(
            f"token id {bad} at input_ids{pos} is outside the vocabulary [0, {vocab_size})"
        )
    if pos_range and (pos_range[0] < 0 or pos_range[1] >= max_sequence_length):
        bad = pos_range[0] if pos_range[0] < 0 else pos_range[1]
        raise ValueError(
            f"position id {bad} is outside [0, max_sequence_length={max_sequence_length})"
        )


class LanguageModelEmbedding(MegatronModule):
    """input_ids [b, s] (+ position_ids [b, s]) -> embeddings [s, b, h] ([s/tp, b, h] under SP)."""

    def __init__(
        self,
        config,
        vocab_size: int,
        max_sequence_length: int,
        position_embedding_type: str = "learned_absolute",
        num_tokentypes: int = 0,
        scatter_to_sequence_parallel: bool = True,
        tp_group=None,
    ):
        super().__init__(config)

        self.vocab_size = vocab_size
        self.max_sequence_length = max_sequence_length
        self.add_position_embedding = position_embedding_type == "learned_absolute"
        self.num_tokentypes = num_tokentypes
        self.scatter_to_sequence_parallel = scatter_to_sequence_parallel
        self.reduce_scatter_embeddings = (
            not self.add_position_embedding
            and config.sequence_parallel
            and scatter_to_sequence_parallel
        )
        self.word_embeddings = tensor_parallel.VocabParallelEmbedding(
            num_embeddings=vocab_size,
            embedding_dim=config.hidden_size,
            init_method=config.embedding_init_method,
            reduce_scatter_embeddings=self.reduce_scatter_embeddings,
            config=config,
        )
        if self.add_position_embedding:
            self.position_embeddings = torch.nn.Embedding(
                max_sequence_length, config.hidden_size, dtype=config.params_dtype
            )
            if config.perform_initialization:
                config.embedding_init_method(self.position_embeddings.weight)
        self.tokentype_embeddings = None
        if num_tokentypes > 0:  # BERT's segment A/B embeddings
            if self.reduce_scatter_embeddings:
                raise ValueError(
                    f"num_tokentypes ({num_tokentypes}) > 0 needs position embeddings or "
                    "sequence_parallel off (the word embeddings are reduce-scattered otherwise)"
                )
            self.tokentype_embeddings = torch.nn.Embedding(
                num_tokentypes, config.hidden_size, dtype=config.params_dtype
            )
            if config.perform_initialization:
                config.embedding_init_method(self.tokentype_embeddings.weight)
        self.embedding_dropout = torch.nn.Dropout(config.hidden_dropout)

    def zero_parameters(self) -> None:
        """Zero every embedding table and mark it `shared` (Megatron: the copy of the input
        embedding on the last pipeline stage, whose grads are all-reduced with the first's).
        Tables this embedding does not have (no position / token-type embeddings) are skipped."""
        for table in (self.word_embeddings, getattr(self, "position_embeddings", None),
                      self.tokentype_embeddings):  # fmt: skip
            if table is not None:
                table.weight.data.fill_(0)
                table.weight.shared = True

    def forward(self, input_ids: Tensor, position_ids: Tensor | None, tokentype_ids=None) -> Tensor:
        """input_ids [b, s], position_ids [b, s] (None = 0..s-1), tokentype_ids [b, s] (only
        with num_tokentypes > 0) -> [s(/tp), b, h]."""

        checked_positions = position_ids if self.add_position_embedding else None
        check_token_ids(input_ids, self.vocab_size, checked_positions, self.max_sequence_length)
        embeddings = self.word_embeddings(input_ids)  # [b, s, h] ([s/tp, b, h] if reduce-scatter)
        if self.config.apply_embedding_scaling:  # Gemma: sqrt(h), rounded to the weights' dtype
            embeddings = embeddings * torch.tensor(
                self.config.hidden_size**0.5, dtype=embeddings.dtype, device=embeddings.device
            )
        if self.add_position_embedding:
            if position_ids is None:
                position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
                if input_ids.shape[1] > self.max_sequence_length:
                    raise ValueError(
                        f"sequence length {input_ids.shape[1]} > max_sequence_length "
                        f"({self.max_sequence_length}) (language_model_embedding.py)"
                    )
            embeddings = embeddings + self.position_embeddings(position_ids)
        if (tokentype_ids is None) != (self.tokentype_embeddings is None):
            raise ValueError(
                f"tokentype_ids must be given exactly when num_tokentypes ({self.num_tokentypes}) "
                "> 0 (language_model_embedding.py)"
            )
        if tokentype_ids is not None:
            embeddings = embeddings + self.tokentype_embeddings(tokentype_ids)  # [b, s, h]
        if not self.reduce_scatter_embeddings:
            embeddings = embeddings.transpose(0, 1).contiguous()  # [s, b, h]
        if self.config.fp32_residual_connection:
            embeddings = embeddings.float()
        if not self.config.sequence_parallel:
            return self.embedding_dropout(embeddings)
        if not self.reduce_scatter_embeddings and self.scatter_to_sequence_parallel:
            embeddings = tensor_parallel.scatter_to_sequence_parallel_region(embeddings)
            if self.config.clone_scatter_output_in_embedding:
                embeddings = embeddings.clone()  # the scatter returns a view of the full tensor
        if self.training and self.embedding_dropout.p > 0:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                embeddings = self.embedding_dropout(embeddings)
        return embeddings

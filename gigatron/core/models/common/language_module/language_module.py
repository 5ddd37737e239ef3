"""Base of language models: LM loss and embedding/output-weight tying across pipeline stages.

Mirrors `megatron.core.models.common.language_module.language_module.LanguageModule`. With tied
weights and one pipeline stage the output layer reads the embedding weight directly; with several
stages the last stage holds its own copy, zeroed, and the first and last stages all-reduce it over
the embedding group so both start equal (finalize_model_grads keeps their grads equal later).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from gigatron.core import parallel_state
from gigatron.core.transformer.module import MegatronModule


class LanguageModule(MegatronModule):
    """MegatronModule with `compute_language_model_loss` and embedding tying."""

    def __init__(self, config, pg_collection=None):
        super().__init__(config)
        self.vp_stage = None
        self.vp_size = config.virtual_pipeline_model_parallel_size

    def compute_language_model_loss(self, labels: Tensor, logits: Tensor) -> Tensor:
        """labels [b, s], logits [s, b, V/tp] -> per-token fp32 loss [b, s] (no mask, no mean)."""
        from gigatron.core import tensor_parallel

        labels = labels.transpose(0, 1).contiguous()  # [s, b]
        # vocab_parallel_cross_entropy overwrites fp32 logits in place, as in Megatron: safe, the
        # output layer's backward needs its input and weight, not the logits.
        loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(), labels)
        return loss.transpose(0, 1).contiguous()  # [b, s]

    def shared_embedding_or_output_weight(self) -> Tensor | None:
        """The word-embedding weight (first stage) or the output weight (last stage)."""
        if self.pre_process:
            return self.embedding.word_embeddings.weight
        if self.post_process:
            return self.output_layer.weight
        return None

    def setup_embeddings_and_output_layer(self) -> None:
        """Mark embedding/output params and tie them across pipeline stages when shared."""
        if self.pre_process:
            self.embedding.word_embeddings.weight.is_embedding_or_output_parameter = True
        if self.post_process and self.output_layer.weight is not None:
            self.output_layer.weight.is_embedding_or_output_parameter = True
        if not self.share_embeddings_and_output_weights:
            return
        if self.config.pipeline_model_parallel_size == 1:
            self.shared_embedding_or_output_weight().zero_out_wgrad = True
            return
        first_chunk = self.vp_stage is None or self.vp_stage == 0
        if self.pre_process and not self.post_process and first_chunk:
            self.shared_embedding_or_output_weight().shared_embedding = True
        if self.post_process and not self.pre_process:
            weight = self.shared_embedding_or_output_weight()
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


def move_to_collective_device(weight: torch.Tensor, group) -> None:
    """A CPU-initialised weight (`use_cpu_initialization`) about to meet a group without a CPU
    backend (NCCL) moves to the current GPU first, as Megatron moves it before tying."""
    if weight.device.type == "cpu" and "gloo" not in str(dist.get_backend(group)):
        weight.data = weight.data.to(torch.device("cuda", torch.cuda.current_device()))

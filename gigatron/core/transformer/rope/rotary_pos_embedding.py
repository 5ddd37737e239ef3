"""Rotary position embeddings (RoPE): the angles (applied to q/k by rope_utils.py).

Mirrors `megatron.core.models.common.embeddings.rotary_pos_embedding.RotaryEmbedding`:
rotary dim = kv_channels * rotary_percent, inv_freq = base^(-2i/dim), angles `[s, 1, 1, dim]`
laid out as [freqs, freqs] (rotate-half, the HF Llama convention) or as interleaved pairs
(rotary_interleaved=True, GPT-J style). Channels past the rotary dim pass through unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gigatron.core.transformer.rope._multimodal_rope import (  # noqa: F401  (Megatron name)
    MultimodalRotaryEmbedding,
)
from gigatron.core.transformer.rope.rope_utils import apply_rotary_pos_emb

__all__ = ["RotaryEmbedding", "apply_rotary_pos_emb"]


class RotaryEmbedding(torch.nn.Module):
    """Produces RoPE angles `[s, 1, 1, dim]` for `forward(max_seq_len, offset=0)` (this context-
    parallel rank's zigzag rows, `[s/cp, 1, 1, dim]`, when the CP group has more than one rank)."""

    def __init__(
        self,
        kv_channels: int,
        rotary_percent: float,
        rotary_interleaved: bool = False,
        seq_len_interpolation_factor: float | None = None,
        rotary_base: int = 10000,
        rope_scaling: bool = False,
        rope_scaling_factor: float = 8.0,
        use_cpu_initialization: bool = False,
        cp_group=None,
    ) -> None:
        super().__init__()
        if not 0.0 < rotary_percent <= 1.0:
            raise ValueError(f"rotary_percent ({rotary_percent}) must be in (0, 1]")
        dim = kv_channels if rotary_percent >= 1.0 else int(kv_channels * rotary_percent)
        if dim % 2 != 0:
            raise ValueError(f"rotary dim ({dim} = kv_channels * rotary_percent) must be even")
        self.dim = dim
        self.rotary_interleaved = rotary_interleaved
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        if rope_scaling:
            inv_freq = _llama3_scaling(inv_freq, rope_scaling_factor)
        # Not saved in checkpoints (Megatron keeps it out of the state dict too).
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if cp_group is None:
            from gigatron.core import parallel_state

            cp_group = parallel_state.get_context_parallel_group(check_initialized=False)
        # Context parallel: forward returns the angles of this rank's zigzag tokens (as Megatron).
        self.cp_group = cp_group if cp_group is not None and cp_group.size() > 1 else None

    def get_freqs_non_repeated(self, max_seq_len: int, offset: int = 0) -> Tensor:
        """Angles `[s, dim/2]` = position * inv_freq."""
        seq = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        if self.seq_len_interpolation_factor is not None:
            seq = seq / self.seq_len_interpolation_factor
        return torch.outer(seq, self.inv_freq)

    def get_cos_sin(self, max_seq_len: int, offset: int = 0) -> tuple[Tensor, Tensor]:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cos(freqs), torch.sin(freqs)

    def forward(
        self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None
    ) -> Tensor:
        """Angles `[s, 1, 1, dim]` for positions offset .. offset + max_seq_len - 1.

        Under context parallelism (`cp_group`, default the constructor's group, of size > 1)
        only this rank's zigzag rows are returned: `[s/cp, 1, 1, dim]`.
        """
        if cp_group is None:
            cp_group = self.cp_group
        elif cp_group.size() == 1:
            cp_group = None
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [s, dim/2]
        if self.rotary_interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).view(freqs.shape[0], -1)  # f0 f0 f1 f1 ..
        else:
            emb = torch.cat((freqs, freqs), dim=-1)  # f0 f1 .. f0 f1 ..
        emb = emb[:, None, None, :]
        if cp_group is not None and not packed_seq:
            from gigatron.core.transformer.context_parallel import get_pos_emb_on_this_cp_rank

            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)  # [s/cp, 1, 1, dim]
        return emb

    def get_rotary_seq_len(
        self, inference_context, transformer, transformer_input, transformer_config, *a, **k
    ) -> int:
        """Full sequence length seen by attention (undoes the SP split of the block input)."""
        if inference_context is not None:
            return inference_context.max_sequence_length
        if transformer is not None and getattr(transformer, "input_tensor", None) is not None:
            seq_len = transformer.input_tensor.size(0)
        else:
            seq_len = transformer_input.size(0)
        if transformer_config.sequence_parallel:
            seq_len *= transformer_config.tensor_model_parallel_size
        return seq_len * transformer_config.context_parallel_size


def _llama3_scaling(inv_freq: Tensor, factor: float, low=1.0, high=4.0, old_ctx=8192) -> Tensor:
    """Llama-3.1 frequency scaling: long wavelengths / factor, short kept, smooth in between."""
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    return torch.where(medium, smoothed, scaled)

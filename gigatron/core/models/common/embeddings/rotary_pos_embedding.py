"""Rotary position embeddings (RoPE) and their application to q/k.

Mirrors `megatron.core.models.common.embeddings.rotary_pos_embedding.RotaryEmbedding` and
`rope_utils.apply_rotary_pos_emb`: rotary dim = kv_channels * rotary_percent, inv_freq =
base^(-2i/dim), angles `[s, 1, 1, dim]` laid out as [freqs, freqs] (rotate-half, the HF Llama
convention) or interleaved pairs (rotary_interleaved=True, GPT-J style). The part of the head
dimension past the rotary dim passes through unchanged.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class RotaryEmbedding(torch.nn.Module):
    """Produces RoPE angles `[s, 1, 1, dim]` for `forward(max_seq_len, offset=0)`."""

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

    def get_freqs_non_repeated(self, max_seq_len: int, offset: int = 0) -> Tensor:
        """Angles `[s, dim/2]` = position * inv_freq."""
        seq = torch.arange(max_seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        if self.seq_len_interpolation_factor is not None:
            seq = seq / self.seq_len_interpolation_factor
        return torch.outer(seq, self.inv_freq)

    def get_cos_sin(self, max_seq_len: int, offset: int = 0) -> tuple[Tensor, Tensor]:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        return torch.cos(freqs), torch.sin(freqs)

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False) -> Tensor:
        """Angles `[s, 1, 1, dim]` for positions offset .. offset + max_seq_len - 1."""
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [s, dim/2]
        if self.rotary_interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).view(freqs.shape[0], -1)  # f0 f0 f1 f1 ..
        else:
            emb = torch.cat((freqs, freqs), dim=-1)  # f0 f1 .. f0 f1 ..
        return emb[:, None, None, :]

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


def _rotate_half(x: Tensor, rotary_interleaved: bool) -> Tensor:
    if not rotary_interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(
    t: Tensor, freqs: Tensor, config=None, cu_seqlens=None, mscale: float = 1.0, cp_group=None
) -> Tensor:
    """Rotate `t` [s, b, n, hn] by angles `freqs` [s, 1, 1, dim]; dims past `dim` pass through."""
    if cu_seqlens is not None:
        raise ValueError("packed sequences (cu_seqlens) are not supported by gigatron's RoPE")
    interleaved = bool(config.rotary_interleaved) if config is not None else False
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos = (torch.cos(freqs) * mscale).to(t.dtype)
    sin = (torch.sin(freqs) * mscale).to(t.dtype)
    t_rot = t_rot * cos + _rotate_half(t_rot, interleaved) * sin
    return torch.cat((t_rot, t_pass), dim=-1)

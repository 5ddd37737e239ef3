"""Megatron's `MultimodalRotaryEmbedding` (mRoPE, Qwen2-VL): rotary angles from three position
streams (temporal, height, width), each owning a section of the rotary channels.

Re-exported by `rotary_pos_embedding`. The table feeds `apply_rotary_pos_emb` like
`RotaryEmbedding`'s: [s, b, 1, dim].
"""

from __future__ import annotations

import torch
from torch import Tensor

from gigatron.core import parallel_state
from gigatron.core.transformer.rope.rope_utils import get_pos_emb_on_this_cp_rank


class MultimodalRotaryEmbedding(torch.nn.Module):
    """inv_freq [dim/2] = base^(-2i/dim) over dim = kv_channels * rotary_percent.

    forward(position_ids [3, b, s], mrope_section [t, h, w] with t + h + w = dim/2) ->
    fp32 [s(/cp), b, 1, dim]: channel pair i reads its angle from stream 0, 1 or 2 by the section
    it falls in (the same sections for both halves, or for both members of an interleaved pair).
    """

    def __init__(
        self,
        kv_channels: int,
        rotary_percent: float,
        rotary_interleaved: bool = False,
        seq_len_interpolation_factor: float | None = None,
        rotary_base: int = 10000,
        cp_group=None,
    ) -> None:
        super().__init__()
        dim = kv_channels if rotary_percent >= 1.0 else int(kv_channels * rotary_percent)
        self.rotary_interleaved = rotary_interleaved
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        exponent = torch.arange(0, dim, 2, dtype=torch.float32) / dim
        self.inv_freq = 1.0 / (rotary_base**exponent)  # [dim/2]
        if cp_group is None:
            cp_group = parallel_state.get_context_parallel_group(check_initialized=False)
        self.cp_group = cp_group

    def forward(self, position_ids: Tensor, mrope_section: list[int], cp_group=None) -> Tensor:
        half = self.inv_freq.numel()
        if len(mrope_section) != 3 or sum(mrope_section) != half:
            raise ValueError(
                f"mrope_section ({mrope_section}) must be 3 sizes (temporal, height, width) "
                f"summing to the rotary channel pairs ({half})"
            )
        pos = position_ids.to(self.inv_freq.device, torch.float32)  # [3, b, s]
        if self.seq_len_interpolation_factor is not None:
            pos = pos / self.seq_len_interpolation_factor
        angles = pos[..., None] * self.inv_freq  # [3, b, s, dim/2]
        stream = torch.repeat_interleave(
            torch.arange(3), torch.tensor(mrope_section)
        )  # [dim/2]: which position stream each channel pair reads
        picked = angles.gather(0, stream.expand(1, *angles.shape[1:3], half))[0]  # [b, s, dim/2]
        if self.rotary_interleaved:
            emb = picked.repeat_interleave(2, dim=-1)  # [b, s, dim]: f0 f0 f1 f1 ...
        else:
            emb = torch.cat((picked, picked), dim=-1)  # [b, s, dim]: halves
        emb = emb.transpose(0, 1)[:, :, None, :].contiguous()  # [s, b, 1, dim]
        cp_group = self.cp_group if cp_group is None else cp_group
        if cp_group is not None and cp_group.size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return emb

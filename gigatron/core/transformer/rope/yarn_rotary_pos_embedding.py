"""YaRN rotary embeddings (DeepSeek-V2/V3's and GPT-OSS's long-context RoPE): multi-latent
attention's own, and GPTModel's with position_embedding_type="yarn" (config `yarn_*` fields).

Mirrors `megatron.core.models.common.embeddings.yarn_rotary_pos_embedding` (YarnRotaryEmbedding,
_yarn_get_mscale); the math is YaRN's (Peng et al. 2023) as DeepSeek and Hugging Face's `yarn`
rope type compute it: frequencies whose wavelength fits the original context many times
(> beta_fast rotations) are kept, those below beta_slow rotations are divided by the scaling
factor, with a linear ramp between; cos/sin are scaled by mscale(factor, mscale) /
mscale(factor, mscale_all_dim) (returned next to the angles, applied by apply_rotary_pos_emb).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gigatron.core.transformer.rope.rotary_pos_embedding import RotaryEmbedding


def _yarn_get_mscale(scale: float = 1, mscale: float = 1) -> float:
    """YaRN's attention temperature: 0.1 * mscale * ln(scale) + 1 (1 when scale <= 1)."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_find_correction_dim(rotations: float, dim: int, base: float, max_pos: int) -> float:
    """The rotary channel index whose frequency turns `rotations` times over max_pos tokens."""
    return (dim * math.log(max_pos / (rotations * 2 * math.pi))) / (2 * math.log(base))


def _yarn_find_correction_range(
    beta_fast: float,
    beta_slow: float,
    dim: int,
    base: float,
    max_pos: int,
    round_to_int: bool = True,
) -> tuple[float, float]:
    """The ramp's channel bounds, rounded outward to integers unless round_to_int is False
    (HF's `truncate: false`, GPT-OSS), clamped to [0, dim - 1]."""
    low = _yarn_find_correction_dim(beta_fast, dim, base, max_pos)
    high = _yarn_find_correction_dim(beta_slow, dim, base, max_pos)
    if round_to_int:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_get_concentration_factor(
    scaling_factor: float, mscale: float | None, mscale_all_dim: float | None
) -> float:
    """The factor on cos/sin (HF's attention_factor): mscale(f, mscale) / mscale(f,
    mscale_all_dim), or mscale(f) when either is None."""
    if mscale is None or mscale_all_dim is None:
        return _yarn_get_mscale(scaling_factor)
    num = _yarn_get_mscale(scaling_factor, mscale)
    return num / _yarn_get_mscale(scaling_factor, mscale_all_dim)


def _yarn_get_concentration_factor_from_config(config) -> float:
    """The concentration factor of a config's `yarn_*` fields (1.0 at their defaults)."""
    return _yarn_get_concentration_factor(
        getattr(config, "yarn_rotary_scaling_factor", 1.0),
        getattr(config, "yarn_mscale", None),
        getattr(config, "yarn_mscale_all_dim", None),
    )


def _yarn_linear_ramp_mask(low: float, high: float, n: int) -> Tensor:
    if low == high:
        high += 0.001  # no division by zero
    return torch.clamp((torch.arange(n, dtype=torch.float32) - low) / (high - low), 0, 1)


class YarnRotaryEmbedding(RotaryEmbedding):
    """RoPE angles `[s, 1, 1, dim]` with YaRN frequencies; `forward` returns (angles, mscale)."""

    def __init__(
        self,
        kv_channels: int,
        rotary_percent: float = 1.0,
        rotary_interleaved: bool = False,
        seq_len_interpolation_factor: float | None = None,
        rotary_base: float = 10000.0,
        use_cpu_initialization: bool = False,
        scaling_factor: float = 1.0,
        original_max_position_embeddings: int = 4096,
        beta_fast: float = 32.0,
        beta_slow: float = 1.0,
        mscale: float = 1.0,
        mscale_all_dim: float = 0.0,
        correction_range_round_to_int: bool = True,
        cp_group=None,
    ) -> None:
        if rotary_interleaved:
            raise ValueError("YarnRotaryEmbedding: rotary_interleaved=True is not supported")
        super().__init__(
            kv_channels,
            rotary_percent,
            seq_len_interpolation_factor=seq_len_interpolation_factor,
            rotary_base=rotary_base,
            cp_group=cp_group,
        )
        dim = self.dim
        extra = self.inv_freq  # base^(-2i/dim): extrapolated (kept) frequencies
        inter = extra / scaling_factor  # interpolated frequencies
        low, high = _yarn_find_correction_range(
            beta_fast,
            beta_slow,
            dim,
            rotary_base,
            original_max_position_embeddings,
            correction_range_round_to_int,
        )
        keep = 1.0 - _yarn_linear_ramp_mask(low, high, dim // 2)  # 1: keep, 0: interpolate
        self.inv_freq = inter * (1 - keep) + extra * keep
        self.mscale = _yarn_get_concentration_factor(scaling_factor, mscale, mscale_all_dim)

    def forward(
        self, max_seq_len: int, offset: int = 0, packed_seq: bool = False, cp_group=None
    ) -> tuple[Tensor, float]:
        """(angles `[s, 1, 1, dim]` (this CP rank's rows under CP), cos/sin scale)."""
        return super().forward(max_seq_len, offset, packed_seq, cp_group), self.mscale

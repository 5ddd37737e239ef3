"""Hugging Face `rope_type: yarn` -> GPTModel(position_embedding_type="yarn") + the config's
`yarn_*` fields (Megatron's names: its GPTModel reads them off the config).

HF (`_compute_yarn_parameters`) and Megatron (`YarnRotaryEmbedding`) compute the same YaRN:
frequencies ramped between kept and divided by `factor` over the channels whose rotations over
`original_max_position_embeddings` fall between `beta_slow` and `beta_fast`, bounds rounded
outward unless `truncate: false` (Megatron's yarn_correction_range_round_to_int), and cos/sin
times a concentration factor: HF uses mscale / mscale_all_dim only when both are non-zero
(else 0.1 ln(factor) + 1), Megatron's ratio with mscale 1, mscale_all_dim 0 is that same value.
"""

from __future__ import annotations

import math

from gigatron.convert.families._family import config_error
from gigatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
    _yarn_get_concentration_factor,
)


def yarn_kwargs(family: str, rope: dict, key: str, cfg: dict) -> tuple[dict, dict]:
    """(TransformerConfig kwargs, GPTModel kwargs) of a HF yarn `rope` dict (read from `key`)."""
    if "original_max_position_embeddings" not in rope:
        raise config_error(family, f"{key}.original_max_position_embeddings", None,
                           "must be set for rope_type 'yarn'")  # fmt: skip
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor")
    factor = float(factor if factor is not None else cfg["max_position_embeddings"] / original)
    partial = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise config_error(family, f"{key}.partial_rotary_factor", partial,
                           "must be 1.0 with rope_type 'yarn'")  # fmt: skip
    mscale, mscale_all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
    if not (mscale and mscale_all_dim):  # HF: the ratio only when both are non-zero
        mscale, mscale_all_dim = 1.0, 0.0
    config = dict(
        yarn_rotary_scaling_factor=factor,
        yarn_original_max_position_embeddings=original,
        yarn_beta_fast=float(rope.get("beta_fast") or 32.0),
        yarn_beta_slow=float(rope.get("beta_slow") or 1.0),
        yarn_mscale=float(mscale),
        yarn_mscale_all_dim=float(mscale_all_dim),
        yarn_correction_range_round_to_int=bool(rope.get("truncate", True)),
    )
    given = rope.get("attention_factor")
    ours = _yarn_get_concentration_factor(factor, config["yarn_mscale"], mscale_all_dim)
    if given is not None and not math.isclose(float(given), ours, rel_tol=1e-12):
        raise config_error(family, f"{key}.attention_factor", given,
                           f"must be null or the factor YaRN derives ({ours!r})")  # fmt: skip
    theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    base = int(theta) if float(theta).is_integer() else float(theta)
    return config, dict(position_embedding_type="yarn", rotary_base=base)

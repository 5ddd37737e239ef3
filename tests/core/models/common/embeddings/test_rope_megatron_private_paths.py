"""rope_utils' Megatron paths: _apply_rotary_pos_emb_bshd / _thd, inverse and MLA interleaving."""

import types

import pytest
import torch

from gigatron.core.models.common.embeddings import rope_utils


class _CP:
    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _rope(t, f):
    """Reference: halves rotation, t [s, n, d], f [s, d]."""
    x1, x2 = t.chunk(2, dim=-1)
    rot = torch.cat((-x2, x1), dim=-1)
    return t * f.cos()[:, None] + rot * f.sin()[:, None]


def test_bshd_matches_the_formula_and_inverse_undoes_it():
    g = torch.randn(5, 1, 4)
    t, f = torch.randn(5, 2, 8), torch.cat((g, g), dim=-1)  # halves share angles, as in RoPE
    out = rope_utils._apply_rotary_pos_emb_bshd(t, f)
    torch.testing.assert_close(out, _rope(t, f[:, 0]))
    back = rope_utils._apply_rotary_pos_emb_bshd(out, f, inverse=True)
    torch.testing.assert_close(back, t, atol=1e-5, rtol=1e-5)


def test_mla_interleaving_with_output_remove_interleaving_equals_pairwise_rotation():
    t, f = torch.randn(3, 2, 8), torch.randn(3, 1, 4).repeat(1, 1, 2)
    out = rope_utils._apply_rotary_pos_emb_bshd(
        t, f, mla_rotary_interleaved=True, mla_output_remove_interleaving=True
    )
    # Rotating (even, odd) pairs in place = Megatron's rotary_interleaved with pairwise angles.
    pairwise = f[..., :4].repeat_interleave(2, dim=-1)
    expect = rope_utils._apply_rotary_pos_emb_bshd(t, pairwise, rotary_interleaved=True)
    torch.testing.assert_close(out, expect)


def test_thd_positions_restart_per_sequence():
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    t, f = torch.randn(6, 2, 8), torch.randn(4, 1, 1, 8)
    out = rope_utils._apply_rotary_pos_emb_thd(t, cu, f, cp_group=_CP(1, 0), max_seqlen=4)
    rows = f[torch.tensor([0, 1, 2, 0, 1, 2])][:, 0, 0]
    torch.testing.assert_close(out, _rope(t, rows))


def test_thd_whole_pack_table_is_read_at_each_sequences_offset_with_cp_zigzag():
    cu = torch.tensor([0, 4, 8], dtype=torch.int32)
    t, f = torch.randn(4, 2, 8), torch.randn(8, 1, 1, 8)
    out = rope_utils._apply_rotary_pos_emb_thd(t, cu, f, cp_group=_CP(2, 0), max_seqlen=4)
    rows = f[torch.tensor([0, 3, 4, 7])][:, 0, 0]  # CP rank 0: chunks 0 and 3 of each sequence
    torch.testing.assert_close(out, _rope(t, rows))
    legacy = rope_utils._apply_rotary_pos_emb_thd(t, cu, f, cp_group=_CP(2, 0))
    torch.testing.assert_close(legacy, out)


def test_thd_needs_a_cp_group():
    with pytest.raises(ValueError, match="cp_group"):
        rope_utils._apply_rotary_pos_emb_thd(
            torch.zeros(2, 1, 4), torch.tensor([0, 2]), torch.zeros(2, 1, 1, 4)
        )


def test_apply_rotary_pos_emb_warns_when_fusion_is_asked_for_an_unfusable_option():
    config = types.SimpleNamespace(rotary_interleaved=False, apply_rope_fusion=True)
    t, f = torch.randn(4, 1, 2, 8), torch.randn(4, 1, 1, 8)
    with pytest.warns(UserWarning, match="inverse RoPE is not supported"):
        out = rope_utils.apply_rotary_pos_emb(t, f, config, inverse=True)
    torch.testing.assert_close(out, rope_utils._apply_rotary_pos_emb_bshd(t, f, inverse=True))
    assert rope_utils.fused_apply_rotary_pos_emb is None

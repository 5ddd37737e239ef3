"""The padded vocabulary a resumed run builds (`resume_vocab_size_with_padding`): the checkpoint's
rows when only the layout changed, this layout's padding when the vocabulary or the divisor did."""

from gigatron.core.models.common.vocab_utils import resume_vocab_size_with_padding as resume


def test_layout_change_keeps_the_checkpoint_rows():
    assert resume(601, 128, 1, 768, 128) == 768  # saved at TP2; TP1 alone would give 640
    assert resume(601, 128, 2, 640, 128) == 640  # saved at TP1; 320 rows per TP rank
    assert resume(601, 128, 4, 768, 128) == 768


def test_padding_is_recomputed_when_it_cannot_be_kept():
    assert resume(601, 64, 1, 768, 128) == 640  # another --make-vocab-size-divisible-by
    assert resume(601, 128, 3, 640, 128) == 768  # TP3 cannot split 640 rows
    assert resume(700, 128, 1, 640, 128) == 768  # the vocabulary grew past the saved rows
    assert resume(601, 128, 1, None, None) == 640  # no saved padding (older args)

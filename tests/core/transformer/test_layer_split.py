"""Layers per pipeline stage / virtual chunk: hand-drawn layouts, errors, and Megatron's own
get_num_layers_to_build / get_transformer_layer_offset as an oracle over a grid of layouts."""

import itertools
from types import SimpleNamespace

import pytest

from gigatron.core.transformer._layer_split import (
    get_num_layers_to_build,
    get_transformer_layer_offset,
    layer_split,
)


def _layers(split):
    """(rank, chunk) -> list of global layer indices."""
    return {k: list(range(o, o + n)) for k, (o, n) in split.items()}


def test_even_and_interleaved_hand_drawn():
    assert _layers(layer_split(8, 2)) == {(0, 0): [0, 1, 2, 3], (1, 0): [4, 5, 6, 7]}
    # Megatron's docstring example: 16 layers, pp 4, vp 2 -> rank 0 holds layers 0-1 and 8-9
    s = _layers(layer_split(16, 4, 2))
    assert s[(0, 0)] == [0, 1] and s[(0, 1)] == [8, 9] and s[(3, 1)] == [14, 15]
    assert _layers(layer_split(8, 2, 4))[(1, 2)] == [5]  # chunk c on rank r: layer c * pp + r


def test_uneven_first_and_last_stage():
    s = _layers(layer_split(10, 4, num_layers_in_first_pipeline_stage=1,
                            num_layers_in_last_pipeline_stage=3))  # fmt: skip
    assert s == {(0, 0): [0], (1, 0): [1, 2, 3], (2, 0): [4, 5, 6], (3, 0): [7, 8, 9]}
    s = _layers(layer_split(6, 2, num_layers_in_first_pipeline_stage=2))
    assert s == {(0, 0): [0, 1], (1, 0): [2, 3, 4, 5]}
    # with 2 chunks: chunk 0 of every stage, then chunk 1 of every stage
    s = _layers(layer_split(12, 3, 2, num_layers_in_first_pipeline_stage=2,
                            num_layers_in_last_pipeline_stage=2))  # fmt: skip
    assert s[(0, 0)] == [0] and s[(1, 0)] == [1, 2, 3, 4] and s[(2, 0)] == [5]
    assert s[(0, 1)] == [6] and s[(1, 1)] == [7, 8, 9, 10] and s[(2, 1)] == [11]


def test_embedding_and_loss_count_as_layers():
    s = _layers(layer_split(6, 4, account_for_embedding_in_pipeline_split=True,
                            account_for_loss_in_pipeline_split=True))  # fmt: skip
    assert s == {(0, 0): [0], (1, 0): [1, 2], (2, 0): [3, 4], (3, 0): [5]}


def test_errors_name_the_values():
    with pytest.raises(ValueError, match=r"num_layers \(6\) must be divisible by .* \(4\)"):
        layer_split(6, 4)
    with pytest.raises(ValueError, match=r"stage 0 \(4\) must be divisible by .* \(3\)"):
        layer_split(8, 2, 3)
    with pytest.raises(ValueError, match=r"the 7 layers left .* 2 remaining pipeline stages"):
        layer_split(9, 4, num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=1)
    cfg = _cfg(8, 2, 2)
    with pytest.raises(ValueError, match=r"vp_stage must be given"):
        get_num_layers_to_build(cfg, None, 0)


def _cfg(num_layers, pp, vp, first=None, last=None, emb=False, loss=False):
    return SimpleNamespace(
        num_layers=num_layers,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        pipeline_model_parallel_layout=None,
        num_layers_in_first_pipeline_stage=first,
        num_layers_in_last_pipeline_stage=last,
        account_for_embedding_in_pipeline_split=emb,
        account_for_loss_in_pipeline_split=loss,
    )


def _valid(cfg):
    try:  # the whole layout is validated whichever chunk is asked for
        vp_stage = None if cfg.virtual_pipeline_model_parallel_size is None else 0
        get_num_layers_to_build(cfg, vp_stage, 0)
    except ValueError:
        return False
    return True


def test_matches_megatron_on_a_grid():
    mblock = pytest.importorskip("megatron.core.transformer.transformer_block")
    mlayer = pytest.importorskip("megatron.core.transformer.transformer_layer")
    checked = 0
    for num_layers, pp, vp, first, last, emb, loss in itertools.product(
        [6, 8, 12, 16], [2, 3, 4], [None, 2], [None, 2], [None, 2], [False, True], [False, True]
    ):
        if (first or last) and (emb or loss):
            continue
        cfg = _cfg(num_layers, pp, vp, first, last, emb, loss)
        if not _valid(cfg):
            continue
        # every chunk's layers tile [0, num_layers) exactly once
        seen = []
        for rank, chunk in itertools.product(range(pp), range(vp or 1)):
            v = None if vp is None else chunk
            ours = (
                get_transformer_layer_offset(cfg, v, rank),
                get_num_layers_to_build(cfg, v, rank),
            )
            theirs = (mlayer.get_transformer_layer_offset(cfg, v, rank),
                      mblock.get_num_layers_to_build(cfg, v, rank))  # fmt: skip
            assert ours == theirs, (vars(cfg), rank, chunk, ours, theirs)
            seen += range(ours[0], ours[0] + ours[1])
        assert sorted(seen) == list(range(num_layers)), vars(cfg)
        checked += 1
    assert checked > 50

"""Marker lanes behind `helpers.build_blending_indices` (private): key lanes for blends with
weights too small to be exact keys, and the rare datasets' counts at the lanes' starts.

A weight w is an exact key row from step t on once fl(w * t) >= 2^(b + 1) (`_blend_keys`). With
weights of 1e-5 that takes millions of steps; these lanes compare such rows as rounded keys and
hand the few lanes where one of them may win to the float64 lanes (`_marked_steps`). A dataset
picked less than once a lane cannot have its count at a lane's start guessed from its weight
alone (it is picked when its error first passes the others' winning error, 0.1 to 0.45 above
zero, not at a fixed point): `_rare_counts` reads it from the lanes' own winning errors.
"""

from __future__ import annotations

import numpy

from gigatron.core.datasets._blend_indices import _count, _lane_steps_wide
from gigatron.core.datasets._blend_keys import _KEY_OFFSET

# Marker lanes: keys for weights too small to be exact keys (blends with tiny weights). A row k
# is exact in a lane once fl(w_k * t) >= 2^(b + 1) at the lane's first step t, now with
# 2^b > D: its tag is `low - 1 - k`. Every other row of that lane gets the tag `low` (all tag
# bits set) over its rounded e + 1.5, so it wins the max whenever its key truncated to the tag
# grid reaches the best exact row's: a "marker" step (out = -1), and the whole lane is run again
# in float64 (`_float_lanes`). A step without a marker is exact: the winning exact key K_j beats
# every inexact v_r with v_r's truncation below K_j, so fl(e_r + 1.5) < e_j + 1.5 and, rounding
# being monotone and 1.5 a whole number of ulps in [1, 4), fl(e_r) < e_j: the C++ picks j too.


def _marker_bits(num: int) -> int:
    """b with 2^b > num: one tag (`low`) more than datasets."""
    return max(1, num.bit_length())


def _marker_tags(w: numpy.ndarray, t0: numpy.ndarray) -> numpy.ndarray:
    """int64 `[D, P]`: `low - 1 - k` where row k is an exact key from each lane's step t0, else
    `low` (the marker tag)."""
    num = w.shape[0]
    b = _marker_bits(num)
    low = (1 << b) - 1
    need = float(1 << (b + 1))
    exact = (w[:, None] * t0[None, :] >= need) | (w[:, None] == 0.0)
    return numpy.where(exact, low - 1 - numpy.arange(num, dtype=numpy.int64)[:, None], low)


def _marker_lane_steps(
    w: numpy.ndarray,
    t0: numpy.ndarray,
    counts: numpy.ndarray,
    nsteps: int,
    out: numpy.ndarray,
    top_keys: numpy.ndarray,
    samp: numpy.ndarray | None = None,
) -> None:
    """Key lanes with marker rows (above): out is -1 at marker steps, whose lanes are wrong
    from there on (the caller runs them again); the other lanes are exact.

    Args:
        w: float64 `[D]` weights.
        t0: float64 `[P]` global step of each lane's first step.
        counts: float64 `[D, P]` counts so far (updated).
        out: int16 `[nsteps, P]` chosen datasets (-1: marker).
        top_keys: int64 `[nsteps, P]` the winning keys, for `_key_guard` (bits `_marker_bits`).
        samp: float64 `[nsteps, P]`, optional: the chosen dataset's count before each step.
    """
    num, lanes = counts.shape
    low = (1 << _marker_bits(num)) - 1
    tags = _marker_tags(w, t0)
    c = numpy.zeros((num + 1, lanes))  # row 0 takes the markers' counts, row k + 1 is dataset k
    c[1:] = counts - _KEY_OFFSET
    flat = c.reshape(-1)
    e = numpy.empty((num, lanes))
    keys = e.view(numpy.int64)
    wk = w[:, None]
    t = numpy.maximum(t0, 1.0)  # steps 0 and 1 both use t = 1 (step 0 is a marker: no exact row)
    base = low * lanes + numpy.arange(lanes, dtype=numpy.int64)  # tag v -> row low - v
    v, pos = numpy.empty(lanes, dtype=numpy.int64), numpy.empty(lanes, dtype=numpy.int64)
    for j in range(nsteps):
        numpy.multiply(wk, t, out=e)
        numpy.subtract(e, c[1:], out=e)  # e_k + 1.5 (exact for exact rows)
        numpy.bitwise_or(keys, tags, out=keys)
        keys.max(axis=0, out=top_keys[j])
        numpy.bitwise_and(top_keys[j], low, out=v)
        numpy.subtract(low - 1, v, out=out[j], casting="unsafe")
        numpy.multiply(v, -lanes, out=pos)
        pos += base
        _count(flat, pos, samp, j)
        if j == 0:
            t = numpy.asarray(t0, dtype=numpy.float64).copy()
        t += 1.0
    counts[:] = c[1:] + _KEY_OFFSET
    if samp is not None:
        samp[:nsteps] += _KEY_OFFSET


def _marker_guard(top_keys: numpy.ndarray, num: int) -> bool:
    """`_key_guard` for `_marker_lane_steps` keys (tag bits `_marker_bits`)."""
    if top_keys.size == 0:
        return True
    one, four = numpy.array([1.0, 4.0]).view(numpy.int64)
    return bool(top_keys.min() >= one + (1 << _marker_bits(num)) and top_keys.max() < four)


_VALID_KEY = int(numpy.array([2.0]).view(numpy.int64)[0])  # a key of error 0.5, tag 0


def _marked_steps(
    w: numpy.ndarray,
    t0: numpy.ndarray,
    counts: numpy.ndarray,
    nsteps: int,
    out: numpy.ndarray,
    top_keys: numpy.ndarray,
    samp: numpy.ndarray | None = None,
    mins: numpy.ndarray | None = None,
) -> None:
    """`_marker_lane_steps`, then the lanes with a marker again in float64 from their start.

    Exact in every lane. `mins`: float64 `[P]`, optional: set to each lane's smallest winning
    error (for `_rare_counts`).
    """
    before = counts.copy()
    _marker_lane_steps(w, t0, counts, nsteps, out, top_keys, samp)
    redo = numpy.flatnonzero(out.min(axis=0) < 0)
    if mins is not None:
        low = (1 << _marker_bits(w.shape[0])) - 1
        mins[:] = (top_keys.min(axis=0) & ~low).view(numpy.float64) - _KEY_OFFSET
    if redo.size == 0:
        return
    fixed = before[:, redo]
    part = numpy.empty((nsteps, redo.size), dtype=numpy.int16)
    part_samp = numpy.empty((nsteps, redo.size))
    _lane_steps_wide(list(w), t0[redo], fixed, nsteps, part, part_samp)
    out[:, redo] = part
    counts[:, redo] = fixed
    if samp is not None:
        samp[:nsteps, redo] = part_samp
    top_keys[:, redo] = _VALID_KEY  # exact float64 lanes: nothing to check
    if mins is not None:
        t = numpy.maximum(t0[redo][None, :] + numpy.arange(nsteps)[:, None], 1.0)
        mins[redo] = (w[part] * t - part_samp).min(axis=0)


def _rare_counts(
    w: numpy.ndarray,
    rare: numpy.ndarray,
    ends: numpy.ndarray,
    mins: numpy.ndarray,
    start: numpy.ndarray,
    end: numpy.ndarray,
) -> numpy.ndarray:
    """float64 `[R, P]`: likely counts of the `rare` datasets at each lane's kept start.

    A dataset picked less than once a lane wins in lane q when its error w * t - c passes the
    others' winning error there, which moves little within a lane: so it is picked in lane q if
    w * ends[q] - c > mins[q] (`ends`: the last kept step, `mins`: the smallest winning error),
    and its count after lane q is max(c, ceil(w * ends[q] - mins[q])): a running max over the
    lanes from lane 0's exact start. `start`, `end` (`[R, P]`): the lanes' counts at their kept
    start and end; a lane that started from the estimate and picked the dataset (the step where
    it wins hides the others' low from `mins`) counts its pick.
    """
    after = numpy.ceil(w[rare][:, None] * ends[None, :] - mins[None, :])  # [R, P]
    est = _running_counts(after, start[:, 0])
    picked = (start == est) & (end > start)
    numpy.maximum(after, end, out=after, where=picked)
    return _running_counts(after, start[:, 0])


def _running_counts(after: numpy.ndarray, c0: numpy.ndarray) -> numpy.ndarray:
    """`[R, P]` counts at each lane's start from `after` (at least the count after each lane)."""
    est = numpy.empty_like(after)
    est[:, 0] = c0
    numpy.maximum(after[:, :-1], c0[:, None], out=est[:, 1:])
    numpy.maximum.accumulate(est[:, 1:], axis=1, out=est[:, 1:])
    return est

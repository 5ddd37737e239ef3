"""Marker lanes behind `helpers.build_blending_indices` (private): key lanes for blends with
weights too small to be exact keys, and the rare datasets' counts at the lanes' starts.

A weight w is an exact key row from step t on once fl(w * t) >= 2^(b + 1) (`_blend_keys`). With
weights of 1e-5 that takes millions of steps; these lanes compare such rows as rounded keys and
redo the few steps where one of them may win in float64 (`_marker_lane_steps`). A dataset
picked less than once a lane cannot have its count at a lane's start guessed from its weight
alone (it is picked when its error first passes the others' winning error, 0.1 to 0.45 above
zero, not at a fixed point): `_rare_counts` reads it from the lanes' own winning errors.
"""

from __future__ import annotations

import numpy

from gigatron.core.datasets._blend_indices import _count
from gigatron.core.datasets._blend_keys import _KEY_OFFSET

_RARE_PER_LANE = 0.25  # "rare": picked fewer times than this in a lane's length of steps
_RARE_PICK = 0.25  # first guess of the error at which a rare dataset is picked

# Marker lanes: keys for weights too small to be exact keys (blends with tiny weights). A row k
# is exact in a lane once fl(w_k * t) >= 2^(b + 1) at the lane's first step t, now with
# 2^b > D: its tag is `low - 1 - k`. Every other row of that lane gets the tag `low` (all tag
# bits set) over its rounded e + 1.5, so it wins the max whenever its key truncated to the tag
# grid reaches the best exact row's: a "marker", and that step of that lane is done again in
# float64, the C++ way. A step without a marker is exact: the winning exact key K_j beats every
# inexact v_r whose truncation is below K_j, so fl(e_r + 1.5) < e_j + 1.5 and, rounding being
# monotone (1.5 an even number of ulps in [1, 4): halfway cases round alike), fl(e_r) < e_j:
# the C++ picks j too.


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
    """Megatron's rule for `nsteps` steps in every lane at once (as `_lane_steps`), exact: key
    lanes with marker rows (above); the lanes with a marker at a step redo it in float64.

    Args:
        w: float64 `[D]` weights.
        t0: float64 `[P]` global step of each lane's first step.
        counts: float64 `[D, P]` counts so far (updated).
        out: int16 `[nsteps, P]` chosen datasets.
        top_keys: int64 `[nsteps, P]` the winning keys, for `_marker_guard`; at a marker, the
            key of the winning error (clipped into the keys' range) with tag 0.
        samp: float64 `[nsteps, P]`, optional: the chosen dataset's count before each step.
    """
    num, lanes = counts.shape
    if lanes == 0:
        return
    low = (1 << _marker_bits(num)) - 1
    tags = _marker_tags(w, t0)
    c = numpy.empty((num, lanes))  # C order: `flat` must be a view
    numpy.subtract(counts, _KEY_OFFSET, out=c)
    flat = c.reshape(-1)
    e = numpy.empty((num, lanes))
    keys = e.view(numpy.int64)
    wk = w[:, None]
    t = numpy.maximum(t0, 1.0)  # steps 0 and 1 both use t = 1
    base = (low - 1) * lanes + numpy.arange(lanes, dtype=numpy.int64)  # tag v -> row low - 1 - v
    v, pos = numpy.empty(lanes, dtype=numpy.int64), numpy.empty(lanes, dtype=numpy.int64)
    for j in range(nsteps):
        numpy.multiply(wk, t, out=e)
        numpy.subtract(e, c, out=e)  # e_k + 1.5 (exact for exact rows)
        numpy.bitwise_or(keys, tags, out=keys)
        keys.max(axis=0, out=top_keys[j])
        numpy.bitwise_and(top_keys[j], low, out=v)
        if v.max() == low:  # markers: these lanes take this step in float64, as the C++
            at = numpy.flatnonzero(v == low)
            err = wk * t[at] - (c[:, at] + _KEY_OFFSET)  # [D, n] fl(fl(w * t) - count)
            best = err.argmax(axis=0)  # first maximum: ties to the lowest index
            v[at] = low - 1 - best
            # clipped into the key range: these steps were just resolved exactly in float64,
            # so the guard never has to vouch for their keys
            win = numpy.clip(err[best, numpy.arange(at.size)], -0.49, 2.49) + _KEY_OFFSET
            top_keys[j, at] = win.view(numpy.int64) & ~low
        numpy.subtract(low - 1, v, out=out[j], casting="unsafe")
        numpy.multiply(v, -lanes, out=pos)
        pos += base
        _count(flat, pos, samp, j)
        if j == 0:
            t = numpy.asarray(t0, dtype=numpy.float64).copy()
        t += 1.0
    counts[:] = c + _KEY_OFFSET
    if samp is not None:
        samp[:nsteps] += _KEY_OFFSET


def _marker_guard(top_keys: numpy.ndarray, num: int) -> bool:
    """`_key_guard` for `_marker_lane_steps` keys (tag bits `_marker_bits`)."""
    if top_keys.size == 0:
        return True
    one, four = numpy.array([1.0, 4.0]).view(numpy.int64)
    return bool(top_keys.min() >= one + (1 << _marker_bits(num)) and top_keys.max() < four)


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
    """`_marker_lane_steps`; `mins`: float64 `[P]`, optional: set to each lane's smallest
    winning error (for `_rare_counts`)."""
    _marker_lane_steps(w, t0, counts, nsteps, out, top_keys, samp)
    if mins is not None:
        low = (1 << _marker_bits(w.shape[0])) - 1
        mins[:] = (top_keys.min(axis=0) & ~low).view(numpy.float64) - _KEY_OFFSET


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


def _rare_rows(w: numpy.ndarray, length: int) -> numpy.ndarray:
    """The datasets picked fewer than `_RARE_PER_LANE` times in `length` steps (a lane)."""
    return numpy.flatnonzero((w * length < _RARE_PER_LANE) & (w > 0.0))


def _rare_guess(w: numpy.ndarray, rare: numpy.ndarray, counts: numpy.ndarray, first: numpy.ndarray):
    """Guess again, in `counts` (`[D, P]`, lanes 1 on), the `rare` datasets' counts: ceil(w * t -
    `_RARE_PICK`) at each lane's first step t (a rare dataset is picked when its error passes
    the others' lows, not at 0.5 as `_guess_counts` assumes); the largest weight takes the rest.
    """
    x = numpy.ceil(w[rare][:, None] * first[None, 1:] - _RARE_PICK)
    numpy.maximum(x, 0.0, out=x)
    counts[int(w.argmax()), 1:] += (counts[rare, 1:] - x).sum(axis=0)
    counts[rare, 1:] = x


def _rare_rerun(w, rare, first, warm, guess, state, mins, steps, bufs) -> None:
    """Run again, from `guess` with the `rare` datasets' counts from `_rare_counts`, the lanes
    whose kept start disagrees with those counts (lane 0 is exact).

    Args:
        w: float64 `[D]` weights; rare: int `[R]` the rare datasets.
        first: int `[P]` each lane's first step; warm: warm-up steps per lane.
        guess: float64 `[D, P]` the lanes' first guessed counts.
        state: (start, end) float64 `[D, P]` counts at each lane's kept start and end (updated).
        mins: float64 `[P]` each lane's smallest winning error.
        steps: `steps(t0, counts, n, out, guard, top_keys, samp)` runs lanes (`helpers`).
        bufs: (choices `[W + L, P]`, samples `[W + L, P]`, winning keys `[W + L, P]`), updated.
    """
    length = bufs[0].shape[0] - warm
    start, end = state
    est = _rare_counts(w, rare, first + warm + length - 1, mins, start[rare], end[rare])
    redo = 1 + numpy.flatnonzero((est[:, 1:] != start[rare, 1:]).any(axis=0))
    if redo.size == 0:
        return
    fixed = guess[:, redo]
    fixed[int(w.argmax())] += (fixed[rare] - est[:, redo]).sum(axis=0)
    fixed[rare] = est[:, redo]
    part = numpy.empty((warm + length, redo.size), dtype=numpy.int16)
    part_samp = numpy.empty((warm + length, redo.size))
    part_top = numpy.empty((warm + length, redo.size), dtype=numpy.int64)
    steps(first[redo], fixed, warm, part[:warm], None, part_top[:warm], part_samp[:warm])
    start[:, redo] = fixed
    kept = (part[warm:], None, part_top[warm:], part_samp[warm:])
    steps(first[redo] + warm, fixed, length, *kept)
    buf, samp, top = bufs
    buf[:, redo] = part
    samp[:, redo] = part_samp
    top[warm:, redo] = part_top[warm:]
    end[:, redo] = fixed

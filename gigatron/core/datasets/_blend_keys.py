"""Key lanes behind `helpers.build_*blending_indices` (private): the float64 greedy rule with
errors compared as int64 keys.

Megatron's rule (`helpers.cpp`) gives step i to the dataset with the largest
`e_k = fl(w_k * max(i, 1)) - c_k` (float64, ties to the lowest k). `_key_lane_steps` computes it
in lanes like `_blend_indices._lane_steps`, with one int64 max per lane and step instead of a
compare-and-select per dataset; `_key_rows`, `_key_ready_step` and `_keys_hold` say when that is
exact, `_key_guard` checks that it stayed so.
"""

from __future__ import annotations

import math

import numpy

from gigatron.core.datasets._blend_indices import _count

# Key lanes. The float64 rule compares e_k = fl(w_k * t) - c_k. Once fl(w_k * t) >= 2^(b + 1)
# (2^b >= D), e_k is a multiple of 2^(b - 51), so e_k + 1.5 (exact while -1.5 < e_k < 2.5) has
# at least b zero low bits in its IEEE pattern. Writing `low - k` there makes one int64 max per
# lane give both the largest error and, on exact ties, the lowest k: four NumPy ops per dataset
# and step instead of five, with no boolean masks. Rows that have not reached the bound yet
# (tiny weights early on) are compared in float64 beside the keys. `guard` collects the range of
# the winning errors: the keys are exact while every error stays in (-1.5, 2.5), which holds when
# the winners stay in (-0.5, 2.5) (an error falls by at most 1 below a winning one) -- callers
# check it and fall back to `_lane_steps` otherwise.
_KEY_OFFSET = 1.5
_KEY_MIN_DATASETS = 6  # fewer: the float lanes are as fast (the keys cost more small ops)


def _key_rows(w: list[float], t: int) -> tuple[list[int], list[int]]:
    """Rows exact as keys from global step `t` on, and the others (to compare in float64)."""
    need = float(1 << (max(1, (len(w) - 1).bit_length()) + 1))
    keys = [k for k in range(len(w)) if w[k] == 0.0 or w[k] * float(t) >= need]
    done = set(keys)
    return keys, [k for k in range(len(w)) if k not in done]


def _key_lane_steps(
    w: list[float],
    rows: tuple[list[int], list[int]],
    t0: numpy.ndarray,
    counts: numpy.ndarray,
    nsteps: int,
    out: numpy.ndarray,
    guard: numpy.ndarray | None = None,
    top_keys: numpy.ndarray | None = None,
    samp: numpy.ndarray | None = None,
) -> None:
    """`_lane_steps` with key rows compared as int64 keys (see above), exact.

    Args:
        rows: (key rows, float rows) from `_key_rows` at the lanes' first step.
        t0, counts, out: as in `_lane_steps` (counts updated in place).
        guard: float64 `[2, P]`: lowered to the min / raised to the max winning error per lane.
        top_keys: int64 `[n, P]`, with no float rows instead of `guard`: the winning keys, for
            `_key_guard` (fewer NumPy calls per step).
        samp: as in `_lane_steps`.
    """
    krows, frows = rows
    num, lanes = counts.shape
    low = (1 << max(1, (num - 1).bit_length())) - 1
    order = krows + frows
    nk = len(krows)
    c = counts[order] - _KEY_OFFSET  # [D, P]: key rows, then float rows
    flat = c.reshape(-1)
    lane_ids = numpy.arange(lanes, dtype=numpy.int64)
    t = numpy.asarray(t0, dtype=numpy.float64).copy()
    v, pos = numpy.empty(lanes, dtype=numpy.int64), numpy.empty(lanes, dtype=numpy.int64)
    win = numpy.empty(lanes)
    if nk:
        e = numpy.empty((nk, lanes))  # [K, P]
        keys = e.view(numpy.int64)
        tag = (low - numpy.asarray(krows, dtype=numpy.int64))[:, None]
        wk = numpy.asarray([w[k] for k in krows], dtype=numpy.float64)[:, None]
        row_of = numpy.zeros(low + 1, dtype=numpy.int64)  # low - k -> row * P
        row_of[low - numpy.asarray(krows)] = numpy.arange(nk) * lanes
        top = numpy.empty(lanes, dtype=numpy.int64)
    if frows:
        fv, err, cf = numpy.empty(lanes), numpy.empty(lanes), numpy.empty(lanes)
        fpos = numpy.empty(lanes, dtype=numpy.int64)
        better, tie = numpy.empty(lanes, dtype=bool), numpy.empty(lanes, dtype=bool)
        forig = numpy.asarray(frows, dtype=numpy.int64)
    if not frows and top_keys is not None:  # the common case: a dozen NumPy calls per step
        base = low * lanes + lane_ids  # key rows are all rows, in order: row k = low - v
        for j in range(nsteps):
            numpy.multiply(wk, t, out=e)
            numpy.subtract(e, c, out=e)  # e_k + 1.5, exact
            numpy.bitwise_or(keys, tag, out=keys)
            keys.max(axis=0, out=top_keys[j])
            numpy.bitwise_and(top_keys[j], low, out=v)
            numpy.subtract(low, v, out=out[j], casting="unsafe")
            numpy.multiply(v, -lanes, out=pos)
            pos += base
            _count(flat, pos, samp, j)
            t += 1.0
        counts[order] = c + _KEY_OFFSET
        if samp is not None:
            samp[:nsteps] += _KEY_OFFSET
        return
    for j in range(nsteps):
        if frows:  # running max over the float rows in index order (ties: first)
            tf = numpy.maximum(t, 1.0) if j == 0 else t
            for q, k in enumerate(frows):
                numpy.add(c[nk + q], _KEY_OFFSET, out=cf)  # the exact count
                numpy.multiply(tf, w[k], out=err if q else fv)
                if q == 0:
                    fv -= cf
                    fpos.fill(nk)
                    continue
                err -= cf
                numpy.greater(err, fv, out=better)
                numpy.putmask(fpos, better, nk + q)
                numpy.maximum(fv, err, out=fv)
        if nk:
            numpy.multiply(wk, t, out=e)
            numpy.subtract(e, c[:nk], out=e)  # e_k + 1.5, exact
            numpy.bitwise_or(keys, tag, out=keys)
            keys.max(axis=0, out=top)
            numpy.bitwise_and(top, low, out=v)
            numpy.take(row_of, v, out=pos)
            numpy.subtract(low, v, out=v)  # winning dataset
            top &= ~low
            numpy.subtract(top.view(numpy.float64), _KEY_OFFSET, out=win)
            if frows:  # a float row wins if larger, or equal with a lower index
                fk = forig[fpos - nk]
                numpy.greater(fv, win, out=better)
                numpy.equal(fv, win, out=tie)
                tie &= fk < v
                better |= tie
                numpy.copyto(v, fk, where=better)
                numpy.copyto(win, fv, where=better)
                numpy.copyto(pos, fpos * lanes, where=better)
        else:
            v = forig[fpos - nk]
            numpy.copyto(win, fv)
            numpy.multiply(fpos, lanes, out=pos)
        out[j] = v
        pos += lane_ids
        _count(flat, pos, samp, j)
        if guard is not None:
            numpy.minimum(guard[0], win, out=guard[0])
            numpy.maximum(guard[1], win, out=guard[1])
        t += 1.0
    counts[order] = c + _KEY_OFFSET
    if samp is not None:
        samp[:nsteps] += _KEY_OFFSET


def _key_ready_step(w: list[float]) -> int:
    """First step from which every dataset is a key row (`_key_rows`)."""
    need = float(1 << (max(1, (len(w) - 1).bit_length()) + 1))
    step = 0
    for x in w:
        if x > 0.0:
            t = max(0, math.ceil(need / x) - 2)
            while x * float(t) < need:
                t += 1
            step = max(step, t)
    return step


def _keys_hold(weights: numpy.ndarray, rows: tuple, begin: int, counts0: list[int]) -> bool:
    """Whether `_key_lane_steps` may start at `begin`: enough key rows, errors in range."""
    krows = rows[0]
    if not krows or weights.shape[0] < _KEY_MIN_DATASETS:
        return False
    k = numpy.asarray(krows)
    err = weights[k] * float(max(begin, 1)) - numpy.asarray(counts0, dtype=numpy.float64)[k]
    return bool((err > -1.5).all() and (err < 2.5).all())


def _key_guard(top_keys: numpy.ndarray, num: int) -> bool:
    """Whether every winning key of `_key_lane_steps` has its error in (-0.5, 2.5).

    A key is bits(e + 1.5) with `b` zero low bits, plus a tag below 2^b: so e + 1.5 > 1 iff the
    key is at least bits(1.0) + 2^b, and e + 1.5 < 4 iff the key is below bits(4.0).
    """
    if top_keys.size == 0:
        return True
    one, four = numpy.array([1.0, 4.0]).view(numpy.int64)
    tags = 1 << max(1, (num - 1).bit_length())
    return bool(top_keys.min() >= one + tags and top_keys.max() < four)

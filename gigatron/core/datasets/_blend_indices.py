"""Exact step rules and lane kernels behind `helpers.build_*blending_indices` (private).

Megatron's greedy blending rule (`helpers.cpp`): step i gives its sample to the dataset with the
largest `w_k * max(i, 1) - count_k` (float64, ties to the lowest k). This module holds the pieces
that compute it: the plain loop (`_greedy_steps`, the reference), the exact two-dataset closed
form (`_two_way_choice`), the side-by-side lane step (`_lane_steps`), the guessed lane start
counts (`_guess_counts`), the one-by-one lane repair (`_sweep_lanes`) and the exhaustive loop
(`_exhaustive_steps`). How the lanes are cut and scheduled is in `helpers._lane_choice`.
"""

from __future__ import annotations

import math

import numpy


def _greedy_steps(
    w: list[float],
    counts: list[int],
    begin: int,
    end: int,
    choice: numpy.ndarray,
    offset: int = 0,
) -> None:
    """Megatron's rule for steps [begin, end): argmax_k w_k * max(i, 1) - counts_k (ties: low k).

    Step i is written to `choice[i - offset]`.
    """
    if offset:
        choice = _Shifted(choice, offset)
    if len(w) > 12:  # many datasets: one NumPy argmax per step beats a Python loop over k
        _greedy_steps_numpy(w, counts, begin, end, choice)
        return
    ks = range(1, len(w))
    for i in range(begin, end):
        t = float(i) if i > 1 else 1.0
        best, best_err = 0, w[0] * t - counts[0]
        for k in ks:
            err = w[k] * t - counts[k]
            if err > best_err:
                best, best_err = k, err
        choice[i] = best
        counts[best] += 1


class _Shifted:
    """`a[i - offset]` for `a[i]`: lets the step loops write a tail buffer by global step."""

    def __init__(self, array: numpy.ndarray, offset: int) -> None:
        self.array, self.offset = array, offset

    def __setitem__(self, i: int, value: int) -> None:
        self.array[i - self.offset] = value


def _greedy_steps_numpy(
    w: list[float], counts: list[int], begin: int, end: int, choice: numpy.ndarray
) -> None:
    weights = numpy.asarray(w, dtype=numpy.float64)
    c = numpy.asarray(counts, dtype=numpy.float64)
    err = numpy.empty_like(weights)
    for i in range(begin, end):
        numpy.multiply(weights, float(i) if i > 1 else 1.0, out=err)
        err -= c
        best = int(err.argmax())  # first maximum: ties go to the lowest index, as in C++
        choice[i] = best
        c[best] += 1.0
    counts[:] = [int(x) for x in c]


def _two_way_choice(w0: float, w1: float, size: int) -> numpy.ndarray:
    """int8 `[size]` choices of the greedy rule for two datasets, exact.

    In exact arithmetic (w0 + w1 = 1, i >= 1) dataset 1 wins iff c0 > w0 * i, so dataset 0 takes
    its j-th sample at p_j = max(p_{j-1} + 1, ceil(j / w0)). Blocks are predicted from that, then
    checked with the float64 rule; the first disagreement is replaced by a few exact steps.
    """
    choice = numpy.empty(size, dtype=numpy.int8)
    counts = [0, 0]
    head = min(size, 2)  # steps 0 and 1 both use t = 1
    _greedy_steps([w0, w1], counts, 0, head, choice)
    start, block = head, 1 << 16
    while start < size:
        end = min(size, start + block)
        n = end - start
        c0 = counts[0]
        j = numpy.arange(c0, c0 + n + 1, dtype=numpy.float64)
        due = numpy.ceil(j / w0) - j
        numpy.maximum.accumulate(due, out=due)
        picks0 = j + numpy.maximum(due, start - c0)  # float: huge (or inf) for tiny w0
        picks0 = picks0[picks0 < end].astype(numpy.int64)
        seg = numpy.ones(n, dtype=numpy.int8)
        seg[picks0 - start] = 0
        # Check every step of the block with the float64 rule, as the C++ computes it.
        is0 = seg == 0
        c0_before = c0 + numpy.cumsum(is0) - is0
        steps = numpy.arange(start, end, dtype=numpy.int64)
        t = steps.astype(numpy.float64)
        err0 = w0 * t - c0_before
        err1 = w1 * t - (steps - c0_before)
        bad = numpy.flatnonzero((err1 > err0).astype(numpy.int8) != seg)
        good = n if bad.size == 0 else int(bad[0])
        choice[start : start + good] = seg[:good]
        counts[0] += int(numpy.count_nonzero(is0[:good]))
        counts[1] = start + good - counts[0]
        start += good
        if good < n:  # repair: exact steps past the disagreement, then predict again
            stop = min(size, start + 64)
            _greedy_steps([w0, w1], counts, start, stop, choice)
            start = stop
    return choice


def _lane_steps(
    w: list[float],
    t0: numpy.ndarray,
    counts: numpy.ndarray,
    nsteps: int,
    out: numpy.ndarray,
    samp: numpy.ndarray | None = None,
) -> None:
    """Megatron's rule for `nsteps` steps in every lane at once, in place.

    Args:
        w: the D weights.
        t0: float64 `[P]` global step of each lane's first step.
        counts: float64 `[D, P]` samples taken so far per dataset and lane (updated).
        out: int16 `[nsteps, P]` receives the chosen dataset of each step and lane.
        samp: float64 `[nsteps, P]`, optional: the chosen dataset's count before the step.
    """
    num, lanes = counts.shape
    flat = counts.reshape(-1)
    lane_ids = numpy.arange(lanes)
    t = numpy.empty(lanes)
    best_err, err = numpy.empty(lanes), numpy.empty(lanes)
    better = numpy.empty(lanes, dtype=bool)
    best = numpy.empty(lanes, dtype=numpy.intp)
    for j in range(nsteps):
        numpy.add(t0, float(j), out=t)
        if j == 0:
            numpy.maximum(t, 1.0, out=t)  # steps 0 and 1 both use t = 1
        numpy.multiply(t, w[0], out=best_err)
        best_err -= counts[0]  # w_0 * t - c_0, rounded twice as in C++
        best.fill(0)
        for k in range(1, num):
            numpy.multiply(t, w[k], out=err)
            err -= counts[k]
            numpy.greater(err, best_err, out=better)  # strict: ties keep the lower index
            numpy.putmask(best, better, k)
            numpy.maximum(best_err, err, out=best_err)
        out[j] = best
        best *= lanes
        best += lane_ids
        _count(flat, best, samp, j)


def _count(flat: numpy.ndarray, pos: numpy.ndarray, samp: numpy.ndarray | None, j: int) -> None:
    """One more sample at each flat position `pos`; the counts before go to `samp[j]`."""
    if samp is None:
        flat[pos] += 1.0
    else:
        numpy.take(flat, pos, out=samp[j])
        flat[pos] = samp[j] + 1.0


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


def _lane_steps_wide(
    w: list[float],
    t0: numpy.ndarray,
    counts: numpy.ndarray,
    nsteps: int,
    out: numpy.ndarray,
    samp: numpy.ndarray | None = None,
) -> None:
    """`_lane_steps` for many datasets: three NumPy calls per step over `[P, D]` rows.

    The errors are the same float64 values; `argmax` returns the first maximum (ties: low k).
    """
    num, lanes = counts.shape
    c = numpy.ascontiguousarray(counts.T)  # [P, D]
    flat = c.reshape(-1)
    base = numpy.arange(lanes) * num
    wrow = numpy.asarray(w, dtype=numpy.float64)[None, :]
    e = numpy.empty((lanes, num))
    t = numpy.asarray(t0, dtype=numpy.float64).copy()
    best = numpy.empty(lanes, dtype=numpy.intp)
    for j in range(nsteps):
        tt = numpy.maximum(t, 1.0) if j == 0 else t  # steps 0 and 1 both use t = 1
        numpy.multiply(tt[:, None], wrow, out=e)
        numpy.subtract(e, c, out=e)
        e.argmax(axis=1, out=best)
        out[j] = best
        best += base
        _count(flat, best, samp, j)
        t += 1.0
    counts[:] = c.T


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


def _guess_counts(w: numpy.ndarray, steps: numpy.ndarray, taken: int) -> numpy.ndarray:
    """float64 `[D, P]` likely counts before each of `steps`: largest remainders of w * (s - 1).

    With weights summing to 1, dataset k's deficit w_k * s - c_k stays near [w_k - 1, w_k), which
    is what w * (s - 1) rounded to a total of s gives. `taken` samples went to datasets outside
    `w` (spent ones); the deficits then rise together, so all ideals shift by one amount.
    """
    num = w.shape[0]
    base = steps.astype(numpy.float64) - 1.0
    ideal = w[:, None] * base + (base - taken - w.sum() * base) / num  # [D, P], sums to s-1-taken
    counts = numpy.floor(ideal)
    short = numpy.clip(steps - taken - counts.sum(axis=0), 0, num).astype(numpy.int64)  # [P]
    # Largest remainder first; per lane along contiguous rows (a guess: tie order is free).
    order = numpy.argsort(numpy.ascontiguousarray((counts - ideal).T), axis=1)  # [P, D]
    rank = numpy.empty_like(order)
    numpy.put_along_axis(rank, order, numpy.arange(num)[None, :], axis=1)
    counts += (rank < short[:, None]).T
    return counts


def _lanes_merge(w: list[float]) -> bool:
    """Whether lanes are worth it: non-negative weights summing to 1 (as BlendedDataset passes).

    Other weights still give exact results in lanes, but guessed counts are then far off and the
    lanes rarely agree, so the plain loop is faster.
    """
    return min(w) >= 0.0 and abs(math.fsum(w) - 1.0) < 1e-6


def _ranks(choice: numpy.ndarray, num: int) -> numpy.ndarray:
    """int64 `[n]`: how often `choice[i]` occurs in `choice[:i]` (a stable radix sort)."""
    order = numpy.argsort(choice, kind="stable")
    per = numpy.bincount(choice, minlength=num)
    rank = numpy.arange(choice.shape[0], dtype=numpy.int64)
    rank -= numpy.repeat(numpy.cumsum(per) - per, per)
    out = numpy.empty_like(rank)
    out[order] = rank
    return out


def _sweep_lanes(
    w: list[float],
    begin: numpy.ndarray,
    start: numpy.ndarray,
    counts: numpy.ndarray,
    out: numpy.ndarray,
    samp: numpy.ndarray | None = None,
) -> list[int]:
    """Make every lane agree with its predecessor, in order, rerunning lanes with the plain loop.

    Args:
        begin: int `[P]` global step where each lane's kept steps start.
        start, counts: float64 `[D, P]` counts of each lane at its kept steps' start and end.
        out: int16 `[L, P]` the lanes' kept steps (rerun lanes are rewritten).
        samp: float64 `[L, P]`, optional: their samples' indices (rewritten with them).

    Returns the lanes rerun.
    """
    length, lanes = out.shape
    swept = []
    todo = list(1 + numpy.flatnonzero((start[:, 1:] != counts[:, :-1]).any(axis=0)))
    todo.reverse()
    while todo:
        lane = int(todo.pop())
        while True:
            exact = [int(x) for x in counts[:, lane - 1]]
            start[:, lane] = exact
            column = numpy.empty(length, dtype=numpy.int16)
            step = int(begin[lane])
            _greedy_steps(w, exact, step, step + length, column, offset=step)
            out[:, lane] = column
            if samp is not None:
                samp[:, lane] = start[column, lane] + _ranks(column, len(w))
            swept.append(lane)
            counts[:, lane] = exact
            lane += 1  # the next lane now starts from new counts: check it again
            if todo and todo[-1] == lane:
                todo.pop()
            if lane == lanes or (start[:, lane] == counts[:, lane - 1]).all():
                break
    return swept


def _exhaustive_steps(
    w: list[float], n: list[int], counts: list[int], begin: int, choice: numpy.ndarray
) -> None:
    """Megatron's exhaustive rule from step `begin` (exact `counts`) to the end of `choice`."""
    unspent = [k for k in range(len(n)) if counts[k] < n[k]]
    for i in range(begin, choice.shape[0]):
        t = float(i) if i > 1 else 1.0
        best, best_err = -1, -math.inf
        for k in unspent:
            err = w[k] * t - counts[k]
            if err > best_err:
                best, best_err = k, err
        choice[i] = best
        counts[best] += 1
        if counts[best] == n[best]:
            unspent.remove(best)

"""Exact step rules and lane kernels behind `helpers.build_*blending_indices` (private).

Megatron's greedy blending rule (`helpers.cpp`): step i gives its sample to the dataset with the
largest `w_k * max(i, 1) - count_k` (float64, ties to the lowest k). This module holds the pieces
that compute it in float64: the plain loop (`_greedy_steps`, the reference), the exact
two-dataset closed form (`_two_way_choice`: unnormalised pairs, and two datasets of an
exhaustive blend beside spent or rare ones), the side-by-side lane steps
(`_lane_steps`; `_lane_steps_wide` for many datasets), the guessed lane start counts
(`_guess_counts`), the one-by-one lane repair (`_sweep_lanes`), the exhaustive loop
(`_exhaustive_steps`) and the reassembly of lanes into step order (`_unlane`). The int64-key lane
steps are in `_blend_keys.py`; how the lanes are cut and scheduled is in `helpers._lane_choice`.
"""

from __future__ import annotations

import math

import numpy
import torch


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


def _two_way_choice(
    w0: float, w1: float, size: int, begin: int = 0, counts0: tuple[int, int] = (0, 0)
) -> numpy.ndarray:
    """int8 `[size]` choices of the greedy rule for two datasets at steps [begin, begin + size).

    `counts0` are the exact counts before step `begin`; the `taken = begin - sum(counts0)`
    samples not in them went to other datasets (spent or rare ones of an exhaustive blend).
    In exact arithmetic (i >= 1) dataset 1 wins iff w1 * i - c1 > w0 * i - c0 with
    c1 = i - taken - c0, i.e. iff c0 > a * i - b with a = (w0 - w1 + 1) / 2, b = taken / 2 (a = w0
    when w0 + w1 = 1), so dataset 0 takes its sample number j (from 0) at
    p_j = max(p_{j-1} + 1, ceil((j + b) / a)). Blocks are predicted from that, then checked with
    the float64 rule; the first disagreement is replaced by a few exact steps.
    """
    choice = numpy.empty(size, dtype=numpy.int8)
    counts = list(counts0)
    taken = begin - counts[0] - counts[1]
    a, b = (w0 - w1 + 1.0) / 2.0, taken / 2.0
    finish = begin + size
    head = min(finish, max(begin, 2))  # steps 0 and 1 both use t = 1
    _greedy_steps([w0, w1], counts, begin, head, choice, offset=begin)
    start, block = head, 1 << 16
    while start < finish:
        end = min(finish, start + block)
        n = end - start
        c0 = counts[0]
        j = numpy.arange(c0, c0 + n + 1, dtype=numpy.float64)
        due = numpy.ceil((j + b) / a) - j
        numpy.maximum.accumulate(due, out=due)
        picks0 = j + numpy.maximum(due, start - c0)  # float: huge (or inf) for tiny a
        picks0 = picks0[picks0 < end].astype(numpy.int64)
        seg = numpy.ones(n, dtype=numpy.int8)
        seg[picks0 - start] = 0
        # Check every step of the block with the float64 rule, as the C++ computes it.
        is0 = seg == 0
        c0_before = c0 + numpy.cumsum(is0) - is0
        steps = numpy.arange(start, end, dtype=numpy.int64)
        t = steps.astype(numpy.float64)
        err0 = w0 * t - c0_before
        err1 = w1 * t - (steps - taken - c0_before)
        bad = numpy.flatnonzero((err1 > err0).astype(numpy.int8) != seg)
        good = n if bad.size == 0 else int(bad[0])
        choice[start - begin : start - begin + good] = seg[:good]
        counts[0] += int(numpy.count_nonzero(is0[:good]))
        counts[1] = start + good - taken - counts[0]
        start += good
        if good < n:  # repair: exact steps past the disagreement, then predict again
            stop = min(finish, start + 64)
            _greedy_steps([w0, w1], counts, start, stop, choice, offset=begin)
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


def _unlane(buf: numpy.ndarray, warm: int, out: numpy.ndarray) -> None:
    """Lanes' kept steps (`[W + L, P]`: lane 0 from step 0, the others from W) in step order.

    Lane p's kept step j is step W + p * L + j (lane 0 also keeps its W first steps): the kept
    block `[L, P]` transposed. torch's blocked transpose of a whole contiguous block is ~10x
    NumPy's strided copy, so the block goes through a `[P, L]` copy first.
    """
    size = out.shape[0]
    length = buf.shape[0] - warm
    numpy.copyto(out[: min(size, warm)], buf[: min(size, warm), 0], casting="unsafe")
    if size <= warm:
        return
    lanes = torch.from_numpy(numpy.ascontiguousarray(buf[warm:])).t().contiguous().numpy()
    full = (size - warm) // length  # [P, L]: lanes kept whole
    end = warm + full * length
    numpy.copyto(out[warm:end].reshape(full, length), lanes[:full], casting="unsafe")
    if end < size:
        numpy.copyto(out[end:], lanes[full, : size - end], casting="unsafe")


def _fill_sample_index(
    choice: numpy.ndarray, num_datasets: int, dataset_index: numpy.ndarray, sample: numpy.ndarray
) -> None:
    size = choice.shape[0]
    if choice is not dataset_index and not numpy.shares_memory(choice, dataset_index):
        dataset_index[:size] = choice
    if num_datasets > 4:  # a stable radix sort beats a pass per dataset
        sample[:size] = _ranks(choice, num_datasets)
        return
    taken = [0] * num_datasets
    for beg in range(0, size, 1 << 20):  # blocks that stay in cache
        part = choice[beg : beg + (1 << 20)]
        out = sample[beg : beg + (1 << 20)]
        for k in range(num_datasets):
            where = numpy.flatnonzero(part == k)
            out[where] = numpy.arange(taken[k], taken[k] + where.size)
            taken[k] += where.size

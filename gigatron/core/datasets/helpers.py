"""Index builders for GPT and blended datasets, in NumPy (Megatron compiles these from C++).

Mirrors `megatron.core.datasets.helpers` (`helpers.cpp`): same signatures, same outputs, bit for
bit. `build_sample_idx` is vectorised: a sample boundary is a global token position `i * seq_len`
in the concatenation of the documents in `document_index` order, so a cumulative sum of document
lengths finds every boundary at once.

Blending: step i gives its sample to the dataset with the largest error `w_k * max(i, 1) - c_k`
(float64, ties to the lowest k; `c_k` is how many samples dataset k has had). The rule is
sequential, but it forgets where it started: two runs from different counts soon take the same
steps. So the steps are cut into P lanes run side by side, one NumPy op over all lanes per step
(`_lane_steps`): lane 0 starts from the exact counts, the others from guessed ones (`_guess`). A
lane is exact once it starts from its predecessor's exact final counts; lanes that do not are run
again from them and stop as soon as their counts meet those of their previous run, whose steps
from there on are then the same (`_greedy`). Each error is rounded as the C++ rounds it, so the
result is the C++ result.
"""

from __future__ import annotations

import math

import numpy

_INT32_MAX = numpy.iinfo(numpy.int32).max
_CELLS = 1 << 16  # lanes x datasets of one step: the [D, P] errors stay in cache
_MIN_LENGTH = 1 << 8  # steps per lane at least: a guessed start is forgotten well before
_CHECK = 64  # steps between checks whether a rerun lane has met its previous run
_SEGMENT = 1 << 23  # steps per `_greedy` call (its buffers take 10 bytes a step)


def build_sample_idx(
    sizes: numpy.ndarray,
    document_indices: numpy.ndarray,
    sequence_length: int,
    num_epochs: int,
    tokens_per_epoch: int,
    drop_last_partial_sequence: bool = True,
    add_extra_token_to_sequence: bool = True,
) -> numpy.ndarray:
    """Start (position in `document_indices`, token offset) of every sample, plus the end.

    Args:
        sizes: int32 `[num_sequences]` sequence lengths.
        document_indices: int32 `[num_docs_total]` sequence ids in epoch-shuffled order.
        sequence_length: tokens per sample (each sample also reads `add_extra` more).
        num_epochs, tokens_per_epoch: as computed by GPTDataset.

    Returns:
        `[num_samples + 1, 2]` int32 (int64 when the values may overflow int32). Sample `i`
        covers tokens from row `i` to row `i + 1` (plus `add_extra`): consecutive samples
        overlap by `add_extra` tokens.
    """
    extra = int(bool(add_extra_token_to_sequence))
    seq_len = int(sequence_length)
    total = int(num_epochs) * int(tokens_per_epoch) - extra
    # An empty split gives total = -1; the C++ integer division truncates that to 0 samples.
    if drop_last_partial_sequence:
        num_samples = max(total, 0) // seq_len
    else:
        # helpers.cpp divides in single precision: ceil(float(total) / seq_length).
        num_samples = max(0, int(math.ceil(numpy.float32(total) / numpy.float32(seq_len))))
    sample_idx_max = max(document_indices.shape[0], int(sizes.max()) if sizes.size else 0)
    out_dtype = numpy.int32 if sample_idx_max <= _INT32_MAX else numpy.int64

    sample_idx = numpy.empty((num_samples + 1, 2), dtype=out_dtype)
    sample_idx[0] = 0
    num_docs = document_indices.shape[0]
    # Sample i >= 1 starts at global token g = i * seq_len of the documents concatenated in
    # `document_indices` order. helpers.cpp records the document position k in which the previous
    # sample's `seq_len + extra` tokens end (cum[k] < g + extra <= cum[k + 1], cum = tokens before
    # position k) and the offset g - cum[k]. So k = #{k : (cum[k + 1] - extra) // seq_len < i}:
    # a bincount + cumsum, no binary search. Blocks of documents keep temporaries in cache.
    done = 0  # samples whose boundary has been placed
    tokens_before = 0  # cum at the start of the block
    block = 1 << 16
    for beg in range(0, num_docs, block):
        if done >= num_samples:
            break
        lengths = numpy.take(sizes, document_indices[beg : beg + block]).astype(numpy.int64)
        cum_end = numpy.cumsum(lengths)
        cum_end += tokens_before
        tokens_before = int(cum_end[-1])
        last = cum_end - extra
        last //= seq_len  # samples whose boundary lies before the end of each document
        numpy.clip(last, done, num_samples, out=last)
        hi = int(last[-1])
        if hi == done:
            continue
        counts = numpy.bincount(last - done, minlength=hi - done + 1)
        local = numpy.cumsum(counts[: hi - done])  # document of boundaries done+1 .. hi, - beg
        rows = sample_idx[done + 1 : hi + 1]
        rows[:, 0] = local + beg
        g = numpy.arange(done + 1, hi + 1, dtype=numpy.int64) * seq_len
        rows[:, 1] = g - (cum_end[local] - lengths[local])
        done = hi
    if done < num_samples:
        # A last partial sample runs past the final document: the C++ stops there and records
        # the last document with offset `size - extra`.
        sample_idx[done + 1 :, 0] = num_docs - 1
        sample_idx[done + 1 :, 1] = int(sizes[document_indices[-1]]) - extra
    return sample_idx


def _lane_steps(
    w: numpy.ndarray,
    counts: numpy.ndarray,
    first: numpy.ndarray,
    choice: numpy.ndarray,
    sample: numpy.ndarray,
) -> None:
    """Megatron's rule in P lanes side by side, one row of `choice` and `sample` per step.

    Args:
        w: float64 `[D]` weights.
        counts: float64 `[D, P]` samples each dataset has had in each lane (updated).
        first: float64 `[P]` global step of each lane's first row.
        choice: int16 `[n, P]` receives the chosen dataset of each step and lane.
        sample: float64 `[n, P]` receives the chosen dataset's count before the step.
    """
    num, lanes = counts.shape
    flat = counts.reshape(-1)
    lane = numpy.arange(lanes)
    mark_type = numpy.min_scalar_type(num)
    back = numpy.arange(num, 0, -1, dtype=mark_type)[:, None]  # D - k: the lowest k marks most
    err, is_top = numpy.empty((num, lanes)), numpy.empty((num, lanes), dtype=bool)
    marks, mark = numpy.empty((num, lanes), dtype=mark_type), numpy.empty(lanes, dtype=mark_type)
    t, top, best = numpy.empty(lanes), numpy.empty(lanes), numpy.empty(lanes, dtype=numpy.intp)
    for j in range(choice.shape[0]):
        numpy.add(first, float(j), out=t)
        numpy.maximum(t, 1.0, out=t)  # steps 0 and 1 both use t = 1
        numpy.multiply(w[:, None], t, out=err)
        err -= counts  # w_k * t - c_k, rounded twice as in C++
        numpy.maximum.reduce(err, axis=0, out=top)
        numpy.equal(err, top, out=is_top)
        numpy.multiply(is_top, back, out=marks)
        numpy.maximum.reduce(marks, axis=0, out=mark)
        numpy.subtract(num, mark, out=best, casting="unsafe")  # ties go to the lowest k, as in C++
        choice[j] = best
        best *= lanes
        best += lane
        numpy.take(flat, best, out=sample[j])
        flat[best] = sample[j] + 1.0


def _tally(choice: numpy.ndarray, num: int) -> numpy.ndarray:
    """float64 `[A, D]`: how often each dataset occurs in each row of int16 `choice` `[A, n]`."""
    rows = choice.shape[0]
    keys = choice + num * numpy.arange(rows)[:, None]
    return numpy.bincount(keys.ravel(), minlength=rows * num).reshape(rows, num).astype(float)


def _run_lanes(w, lanes, start, end, first, choice, sample, diff=None) -> None:
    """Run `lanes` (int `[A]`) through their steps, `_CHECK` at a time.

    start, end: float64 `[P, D]` counts before each lane's first step (read) and after its
    last (written for the lanes run to the end). first: float64 `[P]` global step of each
    lane's first step. choice, sample: `[P, L]` each lane's steps (int16, float64; written).
    diff: float64 `[A, D]`, when `choice` holds a previous run of these lanes: `start` less the
    counts that run started from. A lane stops where its counts meet that run's (`diff` all
    zero): its later steps and its `end` are that run's.
    """
    num, length = w.shape[0], choice.shape[1]
    counts = numpy.ascontiguousarray(start[lanes].T)  # [D, A]
    step_choice = numpy.empty((_CHECK, lanes.size), dtype=numpy.int16)
    step_sample = numpy.empty((_CHECK, lanes.size))
    for j in range(0, length, _CHECK):
        n, a = min(_CHECK, length - j), lanes.size
        part, part_sample = step_choice[:n, :a], step_sample[:n, :a]
        _lane_steps(w, counts, first[lanes] + j, part, part_sample)
        if diff is not None:
            diff += _tally(part.T, num) - _tally(choice[lanes, j : j + n], num)
        rows = lanes if diff is not None else slice(None)  # all lanes: a plain copy
        choice[rows, j : j + n] = part.T
        sample[rows, j : j + n] = part_sample.T
        if diff is not None:
            going = (diff != 0).any(axis=1)
            lanes, diff = lanes[going], diff[going]
            counts = numpy.ascontiguousarray(counts[:, going])
            if lanes.size == 0:
                return
    end[lanes] = counts.T


def _guess(
    w: numpy.ndarray, counts0: numpy.ndarray, ahead: numpy.ndarray, length: int
) -> numpy.ndarray:
    """float64 `[P, D]` likely counts `ahead` (`[P]`) steps after the counts `counts0` (`[D]`).

    The greedy rule keeps the datasets' errors close together, so each count moves by
    `w_k * ahead` plus one shift that makes the lane's total right, rounded by largest
    remainder. Datasets picked less than once in `length` steps are rounded down: one count too
    low is caught up at the lane's first steps, one too high only at its next pick.
    """
    num = w.shape[0]
    ideal = counts0 + ahead[:, None] * w
    ideal += ((ahead - ahead * w.sum()) / num)[:, None]  # each row sums to sum(counts0) + ahead
    counts = numpy.floor(ideal)
    short = numpy.rint(counts0.sum() + ahead - counts.sum(axis=1))  # [P]
    order = numpy.argsort(counts - ideal - (w * length >= 1.0), axis=1)  # rare ones last
    rank = numpy.empty_like(order)
    numpy.put_along_axis(rank, order, numpy.arange(num)[None, :], axis=1)
    return counts + (rank < short[:, None])


def _greedy(w: numpy.ndarray, counts0: numpy.ndarray, begin: int, size: int):
    """Megatron's rule for steps [begin, begin + size) from the exact counts `counts0` (`[D]`).

    Returns int16 chosen datasets and float64 their counts before each step, `[n]` each, for
    the first n <= size steps: all of them, or up to a lane whose disagreement outlives the
    reruns (a count too rare to be guessed; the caller starts again there from exact counts).
    """
    num = w.shape[0]
    lanes = max(1, min(_CELLS // num, size // _MIN_LENGTH))
    if not (numpy.isfinite(w).all() and (w >= 0).all()):
        lanes = 1  # guesses would be far off; one lane is the plain loop
    length = -(-size // lanes)
    first = begin + length * numpy.arange(lanes, dtype=numpy.float64)
    start = _guess(w, counts0, first - begin, length)
    start[0] = counts0
    end = numpy.empty_like(start)
    choice = numpy.empty((lanes, length), dtype=numpy.int16)
    sample = numpy.empty((lanes, length))
    _run_lanes(w, numpy.arange(lanes), start, end, first, choice, sample)
    last_bad = lanes
    while True:  # each pass makes at least the first disagreeing lane exact
        bad = 1 + numpy.flatnonzero((start[1:] != end[:-1]).any(axis=1))
        if bad.size == 0:
            break
        if bad.size >= last_bad:  # no fewer than last pass: a chain, one lane a pass
            size = min(size, int(bad[0]) * length)
            break
        last_bad = bad.size
        diff = end[bad - 1] - start[bad]
        start[bad] = end[bad - 1]
        _run_lanes(w, bad, start, end, first, choice, sample, diff)
    return choice.reshape(-1)[:size], sample.reshape(-1)[:size]


def _blend(w, sizes, dataset_index, dataset_sample_index, size) -> numpy.ndarray:
    """Steps [0, size) of Megatron's rule into the output arrays; returns the final counts.

    sizes: int64 `[D]` for the exhaustive rule (a dataset leaves once it has `sizes[k]`
    samples: a chunk is kept up to the step that spends one), None for the plain rule. A chunk
    cut short makes the next one twice as long as what was kept.
    """
    counts = numpy.zeros(w.shape[0])
    active = numpy.arange(w.shape[0])
    begin, span = 0, _SEGMENT
    while begin < size:
        if sizes is not None:
            active = numpy.flatnonzero(counts < sizes)
        choice, sample = _greedy(w[active], counts[active], begin, min(size - begin, span))
        keep = choice.size
        if sizes is not None:
            spends = numpy.flatnonzero(sample == (sizes[active] - 1)[choice])
            keep = keep if spends.size == 0 else int(spends[0]) + 1
        dataset_index[begin : begin + keep] = active[choice[:keep]]
        dataset_sample_index[begin : begin + keep] = sample[:keep]
        counts[active] += numpy.bincount(choice[:keep], minlength=active.size)
        begin += keep
        span = min(_SEGMENT, max(256, 2 * keep))
    return counts


def build_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    weights: numpy.ndarray | list[float],
    num_datasets: int,
    size: int,
    verbose: bool = False,
) -> None:
    """Fill `dataset_index` (int16 `[size]`) and `dataset_sample_index` (int64 `[size]`) in place.

    Step i picks the dataset with the largest `w_k * max(i, 1) - count_k` (ties: lowest k).
    """
    w = numpy.asarray(weights, dtype=numpy.float64)[:num_datasets]
    # The C++ compares with `>`: a NaN error never wins, and a NaN first one is never beaten.
    nan = numpy.isnan(w)
    if nan.size and nan[0]:
        w = numpy.where(numpy.arange(num_datasets) == 0, numpy.inf, -numpy.inf)
    w = numpy.where(nan, -numpy.inf, w)
    counts = _blend(w, None, dataset_index, dataset_sample_index, size)
    if verbose:
        for k in range(num_datasets):
            print(f"   dataset {k}, input: {weights[k]}, achieved: {counts[k] / max(size, 1)}")


def build_exhaustive_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    sizes: numpy.ndarray | list[int],
    num_datasets: int,
) -> None:
    """Like `build_blending_indices` but draw exactly `sizes[k]` samples from dataset k.

    Weights are `sizes / total`; a dataset leaves the competition once it has its `sizes[k]`.
    """
    n = numpy.asarray(sizes, dtype=numpy.int64)[:num_datasets]
    total = int(n.sum())
    w = n / float(total) if total else n.astype(numpy.float64)
    _blend(w, n, dataset_index, dataset_sample_index, total)

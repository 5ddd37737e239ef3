"""Index builders for GPT and blended datasets, in NumPy (Megatron compiles these from C++).

Mirrors `megatron.core.datasets.helpers` (`helpers.cpp`): same signatures, same outputs, bit for
bit. `build_sample_idx` is vectorised: a sample boundary is a global token position `i * seq_len`
in the concatenation of the documents in `document_index` order, so a cumulative sum of document
lengths plus one `searchsorted` finds every boundary at once. The blending builders follow
Megatron's greedy "largest error first" rule step by step (in float64, like the C++), which is
inherently sequential; they run in a Python loop over samples.
"""

from __future__ import annotations

import math

import numpy

_INT32_MAX = numpy.iinfo(numpy.int32).max


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
    w = [float(x) for x in numpy.asarray(weights, dtype=numpy.float64)[:num_datasets]]
    counts = [0] * num_datasets
    choice = numpy.empty(size, dtype=numpy.int64)
    sample = numpy.empty(size, dtype=numpy.int64)
    ks = range(num_datasets)
    for i in range(size):
        t = float(i) if i > 1 else 1.0
        best, best_err = 0, w[0] * t - counts[0]
        for k in ks:
            err = w[k] * t - counts[k]
            if err > best_err:
                best, best_err = k, err
        choice[i] = best
        sample[i] = counts[best]
        counts[best] += 1
    dataset_index[:size] = choice
    dataset_sample_index[:size] = sample
    if verbose:
        for k in ks:
            print(f"   dataset {k}, input: {w[k]}, achieved: {counts[k] / max(size, 1)}")


def build_exhaustive_blending_indices(
    dataset_index: numpy.ndarray,
    dataset_sample_index: numpy.ndarray,
    sizes: numpy.ndarray | list[int],
    num_datasets: int,
) -> None:
    """Like `build_blending_indices` but draw exactly `sizes[k]` samples from dataset k."""
    n = [int(x) for x in numpy.asarray(sizes, dtype=numpy.int64)[:num_datasets]]
    total = sum(n)
    w = [x / float(total) for x in n]
    counts = [0] * num_datasets
    unspent = [k for k in range(num_datasets) if n[k] > 0]
    choice = numpy.empty(total, dtype=numpy.int64)
    sample = numpy.empty(total, dtype=numpy.int64)
    for i in range(total):
        t = float(i) if i > 1 else 1.0
        best, best_err = -1, -math.inf
        for k in unspent:
            err = w[k] * t - counts[k]
            if err > best_err:
                best, best_err = k, err
        choice[i] = best
        sample[i] = counts[best]
        counts[best] += 1
        if counts[best] == n[best]:
            unspent.remove(best)
    dataset_index[:total] = choice
    dataset_sample_index[:total] = sample

"""Refuse to save replicated tensors whose copies differ across ranks (Megatron's replica check).

A ShardedTensor held by several ranks (TP-replicated norms and position embeddings, DP copies) is
written once, from its main replica (replica_id 0), and every rank gets that copy back at load.
If the copies differ, e.g. a torchrun script that skipped `torch.manual_seed` built them from
different random states, the others are silently replaced at load. Megatron checks parameter
hashes across replicas (`check_param_hashes_across_dp_replicas`); this check runs at save.

Cost: one pass of integer sums over each local tensor on its device, then every rank's
(shard id, checksum) rows go round in one all-gather (after one of the row counts). Every rank
checks the same table, so all raise or none does. Only copies whose checksums differ are looked at
further: 8 random +-1 projections per copy tell values that differ (copies drawn independently;
an error) from rounding-level drift (kernels that sum in a different order; a warning).
"""

from __future__ import annotations

import hashlib
import logging
import math

import torch
import torch.distributed as dist

from gigatron.core.dist_checkpointing.core import CheckpointingException

logger = logging.getLogger(__name__)

_CHUNK = 1 << 24  # words per step: bounds the temporary int64 / float64 copies
_NUM_PROJECTIONS = 8
# ||a - b||^2 / ||a||^2 above this is "different values": independent draws give ~2, a few
# ulps of drift ~1e-10 (bf16: ~1e-5)
_DIFFERENT = 1e-4


def check_replicas_equal(tensors: list, group=None) -> None:
    """Raise CheckpointingException on every rank of `group` (default: the world) when the copies
    of a replicated ShardedTensor in `tensors` differ across ranks. Collective."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    device = _comm_device(group)
    local = {_shard_id(t): t for t in tensors if _has_data(t)}
    ids = sorted(local)
    rows = torch.zeros(len(ids), 3, dtype=torch.int64, device=device)
    if ids:
        rows[:, 0] = torch.tensor(ids, dtype=torch.int64)
        rows[:, 1:] = torch.stack([_checksum(local[i].data).to(device) for i in ids])
    table = _all_gather_rows(rows, group)
    mismatched = _mismatched_ids(table)
    if mismatched:
        _report(mismatched, local, group)


def _has_data(t) -> bool:
    data = getattr(t, "data", None)
    return isinstance(data, torch.Tensor) and data.numel() > 0 and data.device.type != "meta"


def _shard_id(t) -> int:
    """63-bit id of the data a ShardedTensor holds, the same on every rank holding a copy."""
    r = t.flattened_range
    text = repr((t.key, tuple(t.global_offset), None if r is None else (r.start, r.stop)))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _words(data: torch.Tensor) -> torch.Tensor:
    """The bytes of `data` as int32 words (zero-padded)."""
    raw = data.detach().contiguous().view(-1).view(torch.uint8)
    pad = -raw.numel() % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int32)


def _checksum(data: torch.Tensor) -> torch.Tensor:
    """int64 [2]: plain and position-weighted (wrapping) sums of the words of `data`."""
    words = _words(data)
    sums = torch.zeros(2, dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), _CHUNK):
        w = words[start : start + _CHUNK].to(torch.int64)
        pos = torch.arange(start, start + w.numel(), device=w.device) % 65521 + 1
        sums[0] += w.sum()
        sums[1] += (w * pos).sum()
    return sums


def _is_tied_output_copy(t) -> bool:
    """A last pipeline stage's tied output weight, saved as a non-main copy of the word
    embedding (replica id (1, tp, dp): LanguageModule's tying)."""
    replica_id = getattr(t, "replica_id", 0)
    first = replica_id[0] if isinstance(replica_id, tuple) and replica_id else replica_id
    return first == 1 and str(t.key).endswith("word_embeddings.weight")


def _comm_device(group) -> torch.device:
    if "nccl" in str(dist.get_backend(group)):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_gather_rows(rows: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's [n_r, 3] int64 rows (shard id, 2 sums): counts first, then padded rows."""
    device, world = rows.device, dist.get_world_size(group)
    count = torch.tensor([rows.shape[0]], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(count) for _ in range(world)]
    dist.all_gather(counts, count, group=group)
    counts = [int(c) for c in counts]
    padded = torch.zeros(max(counts), 3, dtype=torch.int64, device=device)
    padded[: rows.shape[0]] = rows
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded, group=group)
    return [g[:n].cpu() for g, n in zip(gathered, counts)]


def _mismatched_ids(table: list[torch.Tensor]) -> list[int]:
    sums: dict[int, set] = {}
    for rows in table:
        for shard, plain, weighted in rows.tolist():
            sums.setdefault(shard, set()).add((plain, weighted))
    return sorted(shard for shard, seen in sums.items() if len(seen) > 1)


def _projections(data: torch.Tensor) -> list[float]:
    """[||x||^2, p_1 .. p_8]: float64 squared norm and random +-1 projections of `data`."""
    x = data.detach().reshape(-1)
    out = torch.zeros(_NUM_PROJECTIONS + 1, dtype=torch.float64, device=x.device)
    for start in range(0, x.numel(), _CHUNK):
        v = x[start : start + _CHUNK].double()
        pos = torch.arange(start, start + v.numel(), device=v.device)
        out[0] += (v * v).sum()
        for j in range(_NUM_PROJECTIONS):
            bits = (pos * (2654435761 + 2 * j) + 40503 * j) % 4294967296 >> 31
            out[j + 1] += (v * (1 - 2 * bits).double()).sum()
    return out.tolist()


def _report(mismatched: list[int], local: dict, group) -> None:
    """Gather names and projections of the differing copies; raise, or warn for drift."""
    mine = {
        i: (local[i].key, _projections(local[i].data), _is_tied_output_copy(local[i]))
        for i in mismatched
        if i in local
    }
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    different, drifted, tied = [], [], []
    for shard in mismatched:
        copies = [(r, got[shard]) for r, got in enumerate(everyone) if shard in got]
        key, ref, _ = copies[0][1]
        norm2 = max(max(stats[0] for _, (_, stats, _) in copies), 1e-30)
        # mean squared projection difference estimates ||a - b||^2 (Johnson-Lindenstrauss)
        worst = max(
            sum((a - b) ** 2 for a, b in zip(stats[1:], ref[1:])) / _NUM_PROJECTIONS / norm2
            for _, (_, stats, _) in copies
        )
        ranks = [r for r, _ in copies]
        entry = f"{key!r} (ranks {ranks}, relative difference ~{math.sqrt(worst):.2g})"
        (different if worst > _DIFFERENT else drifted).append(entry)
        if worst > _DIFFERENT and any(is_tied for _, (_, _, is_tied) in copies):
            tied.append(entry)
    if drifted and dist.get_rank() == 0:
        logger.warning(
            "replicated tensors differ across ranks at rounding level (the main replica is "
            "saved): %s",
            "; ".join(drifted[:5]),
        )
    if tied:
        raise CheckpointingException(
            f"the tied word embedding differs between the pipeline stages that hold it: "
            f"{'; '.join(tied)}. With share_embeddings_and_output_weights=True the first "
            "stage's word embedding and the last stage's output-layer copy start equal and "
            "stay equal only if their gradients are summed over the embedding group before "
            "each optimizer step; only one copy would be saved. Wrap each model chunk in "
            "DistributedDataParallel and call finalize_model_grads(model) after the schedule "
            "(a plain torch optimizer needs finalize_model_grads too), or all-reduce that "
            "weight's grad over parallel_state.get_embedding_group()"
        )
    if different:
        more = f"; ... {len(different) - 5} more" if len(different) > 5 else ""
        shown = "; ".join(different[:5]) + more
        raise CheckpointingException(
            f"{len(different)} replicated tensor(s) differ across the ranks that hold copies of "
            f"them: {shown}. Only one copy is saved and every rank gets it back at load, so "
            "the model would silently change. The ranks built the model from different random "
            "states: call torch.manual_seed(seed) and model_parallel_cuda_manual_seed(seed) with "
            "the same seed on every rank before building the model"
        )

"""Read one rank's piece of a gigatron tensor from HF safetensors: only the bytes it owns.

No counterpart in megatron.core. A piece is a box in the full (TP = EP = 1) per-layer tensor
(`_ckpt_layout.tensor_slices`). Most recipes only move rows: `same`, `qkv` / `fused_qkv` (rows
regrouped per query group), `glu` ([gate; up]), `vocab` (zero rows appended). For those the rows
of the box come from contiguous row ranges of the HF inputs (a TP slice of a fused QKV is a run
of query groups: a run of q rows, of k rows, of v rows), so only those ranges (and the box's
columns) are read. Whether a recipe only moves rows is found by running `to_gig` on probes: a
pair of columns (row id, -row id; ids 1-based over the inputs, 0 = none), once shifted and
once tripled; a row movement
maps each id to itself under both. Anything else (GPT-2's transposes, arithmetic) reads its
inputs whole, transforms, and cuts the box.
"""

from __future__ import annotations

import torch

from gigatron.convert.hf_io import HFReader

_SHIFT = float(1 << 30)


def row_sources(recipe, rows: list[int]) -> torch.Tensor | None:
    """[out rows, 2] (input index, input row; -1, -1 for a padding row) of `recipe.to_gig` on
    inputs with `rows` rows each, or None when to_gig is not a row movement."""
    offsets = [sum(rows[:i]) for i in range(len(rows))]
    # two columns (id, -id): a movement of whole rows keeps them paired
    ids = [torch.arange(1, n + 1, dtype=torch.float64).add(o) for n, o in zip(rows, offsets)]
    ids = [torch.stack([t, -t], dim=1) for t in ids]
    try:
        got = recipe.to_gig(*ids)
        shifted = recipe.to_gig(*(t + _SHIFT for t in ids))
        tripled = recipe.to_gig(*(t * 3 for t in ids))
    except Exception:  # a probe a recipe cannot take (a transform on the width): read whole
        return None
    if got.dim() != 2 or got.shape[1] != 2 or not got.shape == shifted.shape == tripled.shape:
        return None
    out, pad = got[:, 0], got[:, 0] == 0
    moved = torch.where(pad, 0.0, out + _SHIFT)
    total = sum(rows)
    ok = (
        torch.equal(got[:, 1], -out)
        and torch.equal(out, out.round())
        and bool(((out >= 0) & (out <= total)).all())
        and torch.equal(shifted[:, 0], moved)
        and torch.equal(tripled[:, 0], out * 3)
    )
    if not ok:
        return None
    flat = out.long() - 1  # global row over the concatenated inputs, -1 for padding
    which = torch.bucketize(flat, torch.tensor(offsets[1:] + [total]), right=True)
    start = torch.tensor(offsets)[which.clamp(max=len(rows) - 1)]
    return torch.stack([torch.where(pad, -1, which), torch.where(pad, -1, flat - start)], dim=1)


class PartReader:
    """`(name, box) -> that part of the full gigatron tensor`, read from HF files."""

    def __init__(self, reader: HFReader, by_key: dict, hf_dir: str):
        self.reader, self.by_key, self.hf_dir = reader, by_key, hf_dir
        self._sources: dict[str, torch.Tensor | None] = {}
        self._last: tuple[str, torch.Tensor] | None = None

    def __call__(self, name: str, box: tuple) -> torch.Tensor:
        if name not in self.by_key:
            raise ValueError(f"load_hf_into_model: {name} has no HF source in {self.hf_dir}")
        recipe = self.by_key[name]
        if recipe.stack is not None:  # one expert's slice of stacked HF tensors: read whole
            return self._whole(name, recipe)[box]
        metas = [self.reader.meta(k) for k in recipe.hf_keys]
        if name not in self._sources:
            rows_ok = all(m.dim() >= 1 for m in metas)
            self._sources[name] = (
                row_sources(recipe, [m.shape[0] for m in metas]) if rows_ok else None
            )
        sources = self._sources[name]
        if sources is None:
            return self._whole(name, recipe)[box]
        return self._rows(recipe, metas, sources, box)

    def _rows(self, recipe, metas, sources: torch.Tensor, box: tuple) -> torch.Tensor:
        """The box, read as the row ranges of each input its rows come from."""
        r0, r1, _ = box[0].indices(sources.shape[0]) if box else (0, sources.shape[0], 1)
        src = sources[r0:r1]
        rest = tuple(box[1:])
        first = metas[0][(slice(0, 0), *rest)]
        out = torch.zeros((r1 - r0, *first.shape[1:]), dtype=first.dtype)
        for i, key in enumerate(recipe.hf_keys):
            mine = (src[:, 0] == i).nonzero()[:, 0]
            if not len(mine):
                continue
            rows = src[mine, 1]
            lo, hi = int(rows.min()), int(rows.max()) + 1
            part = self.reader.read(key, (slice(lo, hi), *rest))
            out[mine] = part[rows - lo]
        return out

    def _whole(self, name: str, recipe) -> torch.Tensor:
        """The full tensor (kept for the next piece of the same name: a GLU's gate and up)."""
        if self._last is None or self._last[0] != name:
            self._last = None  # drop the previous tensor before reading the next
            full = recipe.to_gig(*(self.reader.read(k) for k in recipe.hf_keys))
            self._last = (name, full)
        return self._last[1]

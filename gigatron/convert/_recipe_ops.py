"""The tensor recipes' building blocks: Recipe and the per-tensor transforms families declare.

A Recipe is one Megatron checkpoint key and the HF tensors it is made of, with `to_gig(*hf) ->
megatron` and its exact inverse `to_hf(megatron) -> tuple(hf)`: both directions come from the one
declaration. Both are pure tensor functions, so the same recipe plans shapes on meta tensors,
converts whole checkpoints one key at a time, and fills a TP/PP/EP-sharded model. Layouts:

- fused QKV rows grouped per query group: [q_1 .. q_{np/ng}, k, v] for group 1, then group 2 ..
  (`qkv`: HF's separate q/k/v; `fused_qkv`: one HF [Q; K; V] tensor such as Phi-3's qkv_proj);
- GLU fc1 rows [all gate; all up] (`glu`: HF gate_proj + up_proj; a fused HF gate_up_proj is
  already this layout: `same`);
- `transposed`: GPT-2's Conv1D [in, out] <-> nn.Linear's [out, in];
- `vocab`: embedding / output rows padded with zeros to the padded vocabulary;
- `stacked`: one expert's slice of a HF tensor holding all E experts ([E, ...], GPT-OSS), with a
  per-slice transform (`interleaved_glu` rows g_0, u_0, g_1, u_1 .. <-> [gate; up], transposes).
HF Llama-style RoPE is rotate-half, Megatron's default (rotary_interleaved=False): no row
permutation of q / k.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Recipe:
    key: str
    hf_keys: tuple[str, ...]
    to_gig: Callable[..., Tensor]
    to_hf: Callable[[Tensor], tuple[Tensor, ...]]
    stack: tuple[int, int] | None = None
    """(e, E) for one expert of HF tensors that stack E experts on a new leading dim: `to_gig`
    takes the whole stacked tensors, `to_hf` gives expert e's slice of each (`hf_outputs`
    stacks the E slices back)."""


def qkv_to_megatron(q: Tensor, k: Tensor, v: Tensor, num_heads: int, num_groups: int) -> Tensor:
    """q [np*hn, ...], k/v [ng*hn, ...] -> fused rows [ng * (np/ng + 2) * hn, ...] per group."""
    hn = q.shape[0] // num_heads
    rest = q.shape[1:]
    q = q.reshape(num_groups, (num_heads // num_groups) * hn, *rest)
    k = k.reshape(num_groups, hn, *rest)
    v = v.reshape(num_groups, hn, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def qkv_from_megatron(qkv: Tensor, num_heads: int, num_groups: int):
    """Inverse of qkv_to_megatron: fused rows -> (q [np*hn, ...], k [ng*hn, ...], v)."""
    q_per_group = num_heads // num_groups
    hn = qkv.shape[0] // (num_groups * (q_per_group + 2))
    rest = qkv.shape[1:]
    grouped = qkv.reshape(num_groups, (q_per_group + 2) * hn, *rest)
    q, k, v = torch.split(grouped, [q_per_group * hn, hn, hn], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _contiguous(*ts: Tensor) -> tuple[Tensor, ...]:
    return tuple(t.contiguous() for t in ts)


def same(key: str, hf_key: str) -> Recipe:
    return Recipe(key, (hf_key,), lambda t: t, lambda t: (t,))


def transposed(key: str, hf_key: str) -> Recipe:
    return Recipe(key, (hf_key,), lambda t: t.t().contiguous(), lambda t: (t.t().contiguous(),))


def vocab(key: str, hf_key: str, vocab_size: int, padded: int) -> Recipe:
    """Vocabulary rows [v, h] <-> [padded, h] (zero rows appended, dropped on export)."""

    def to_gig(t):
        return F.pad(t, (0, 0, 0, padded - t.shape[0])) if padded > t.shape[0] else t

    return Recipe(key, (hf_key,), to_gig, lambda t: (t[:vocab_size].contiguous(),))


def glu(key: str, gate: str, up: str) -> Recipe:
    """HF gate [f, ...] + up [f, ...] <-> Megatron fc1 [2f, ...] = [gate; up]."""
    return Recipe(
        key, (gate, up), lambda g, u: torch.cat([g, u], dim=0), lambda t: _contiguous(*t.chunk(2))
    )


def qkv(key: str, q: str, k: str, v: str, heads: int, groups: int) -> Recipe:
    """HF q / k / v projections (weight or bias) <-> Megatron's fused per-group QKV rows."""
    return Recipe(
        key,
        (q, k, v),
        lambda tq, tk, tv: qkv_to_megatron(tq, tk, tv, heads, groups),
        lambda t: _contiguous(*qkv_from_megatron(t, heads, groups)),
    )


def fused_qkv(key: str, hf_key: str, heads: int, groups: int) -> Recipe:
    """One HF tensor of rows [Q (np*hn); K (ng*hn); V (ng*hn)] <-> Megatron's per-group rows."""

    def split(t):
        hn = t.shape[0] // (heads + 2 * groups)
        return torch.split(t, [heads * hn, groups * hn, groups * hn], dim=0)

    def to_hf(t):
        return (torch.cat(qkv_from_megatron(t, heads, groups), dim=0).contiguous(),)

    return Recipe(key, (hf_key,), lambda t: qkv_to_megatron(*split(t), heads, groups), to_hf)


def optional(names, recipe: Recipe) -> list[Recipe]:
    """[recipe] when every HF tensor it reads is in `names` (biases, QK norms), else []."""
    return [recipe] if all(k in names for k in recipe.hf_keys) else []


def interleaved_glu(t: Tensor) -> Tensor:
    """GLU rows interleaved [g_0, u_0, g_1, u_1, ..] -> Megatron's [gate; up] (dim 0)."""
    return torch.cat([t[0::2], t[1::2]], dim=0)


def interleave_glu(t: Tensor) -> Tensor:
    """Inverse of interleaved_glu: [gate; up] rows -> [g_0, u_0, g_1, u_1, ..]."""
    gate, up = t.chunk(2)
    return torch.stack([gate, up], dim=1).reshape(t.shape)


def stacked(
    key: str, hf_key: str, e: int, num: int, fn: Callable = None, inverse: Callable = None
) -> Recipe:
    """Expert e of HF tensor [E, ...] <-> Megatron `key` = fn(slice e) (E = num; fn and its
    exact inverse act on one slice; identity when omitted)."""
    fn, inverse = fn or (lambda t: t), inverse or (lambda t: t)
    return Recipe(
        key, (hf_key,), lambda t: fn(t[e]).contiguous(), lambda t: (inverse(t).contiguous(),),
        stack=(e, num),
    )  # fmt: skip


def hf_outputs(recipes, tensor_of: Callable[[str], Tensor]):
    """(HF name, tensor) of each recipe's inverse on `tensor_of(recipe.key)`, in recipe order;
    a stacked HF tensor comes once, when its last expert slice is made (torch.stack of the E
    slices: one stacked tensor per name is held at a time). Works on meta tensors (plans)."""
    pending: dict[str, list] = {}
    for r in recipes:
        outs = r.to_hf(tensor_of(r.key))
        if r.stack is None:
            yield from zip(r.hf_keys, outs)
            continue
        e, num = r.stack
        for name, t in zip(r.hf_keys, outs):
            slots = pending.setdefault(name, [None] * num)
            slots[e] = t
            if all(s is not None for s in slots):
                yield name, torch.stack(pending.pop(name))
    if pending:
        name, slots = next(iter(pending.items()))
        missing = [i for i, s in enumerate(slots) if s is None]
        raise ValueError(f"{name}: stacked HF tensor lacks experts {missing[:8]}")

"""The banner rank 0 prints at startup: the arguments that differ from their defaults and
which (tp, pp, dp, cp, ep) coordinates each rank holds.

Part of `gigatron.training.training` (Megatron's `_print_args` dumps every argument; this
prints only the ones the flags or the derivations of `validate_args` changed, and adds the rank
layout the parallel groups were built with).
"""

from __future__ import annotations

import enum

import torch.distributed as dist

from gigatron.core import parallel_state as ps

_DERIVED = ("world_size", "data_parallel_size", "padded_vocab_size", "params_dtype")
_MAX_RANK_ROWS = 64


def changed_args(args, parser) -> list[tuple[str, str]]:
    """(name, value) of each flag whose resolved value differs from its default, then the
    derived sizes Megatron prints with them."""
    defaults = {a.dest: a.default for a in parser._actions if a.option_strings}
    out = []
    for name, value in sorted(vars(args).items()):
        if name in defaults and not _same(value, defaults[name]):
            out.append((name, _show(value)))
    return out + [(n, _show(getattr(args, n))) for n in _DERIVED if hasattr(args, n)]


def _same(value, default) -> bool:
    if isinstance(value, enum.Enum):
        value = value.name
    return value == default


def _show(value) -> str:
    if isinstance(value, enum.Enum):
        return value.name
    return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def rank_layout() -> list[tuple[int, ...]]:
    """(tp, pp, dp, cp, ep) rank of every global rank, gathered from the built groups (one
    all_gather_object: every rank calls it)."""
    mine = (
        ps.get_tensor_model_parallel_rank(),
        ps.get_pipeline_model_parallel_rank(),
        ps.get_data_parallel_rank(),
        ps.get_context_parallel_rank(),
        ps.get_expert_model_parallel_rank(),
    )
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, mine)
    return rows


def banner(args, parser, rows: list[tuple[int, ...]]) -> str:
    """The text rank 0 prints: the changed arguments, then the layout of `rows`."""
    changed = changed_args(args, parser)
    width = max([len(n) for n, _ in changed] + [20]) + 4
    lines = [" arguments that differ from the defaults ".center(width + 30, "-")]
    lines += [f"  {name} {'.' * (width - len(name))} {value}" for name, value in changed]
    return "\n".join(lines) + "\n" + layout_table(rows, args)


def layout_table(rows: list[tuple[int, ...]], args) -> str:
    sizes = (
        f"tp {args.tensor_model_parallel_size} x pp {args.pipeline_model_parallel_size} x dp "
        f"{args.data_parallel_size} x cp {args.context_parallel_size}, ep "
        f"{args.expert_model_parallel_size}"
    )
    lines = [f"rank layout ({len(rows)} ranks: {sizes}): rank -> (tp, pp, dp, cp, ep)"]
    shown = rows[:_MAX_RANK_ROWS]
    lines += [f"  {r:>5} -> ({', '.join(map(str, row))})" for r, row in enumerate(shown)]
    if len(rows) > len(shown):
        lines.append(f"  ... {len(rows) - len(shown)} more ranks")
    return "\n".join(lines)


def print_startup_banner(args, parser) -> None:
    """Every rank calls this (the layout is gathered); rank 0 prints."""
    rows = rank_layout()
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(banner(args, parser, rows), flush=True)

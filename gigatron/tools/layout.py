"""`gigatron layout`: which rank holds which piece of the model, as a table and a picture.

    gigatron layout --world-size 16 --tp 2 --pp 2 --gpus-per-node 8 --out layout.svg
    gigatron layout --world-size 4 --pp 4 --vpp 2 --num-layers 16 --out chunks.svg

The groups come from `parallel_state.rank_layout`, the function `initialize_model_parallel`
builds its process groups from, so the table is what a run with these sizes creates. `--order`
is `initialize_model_parallel`'s `order` (Megatron's string, first axis = adjacent ranks, e.g.
"tp-cp-ep-dp-pp", its default). The picture has one panel per axis of size > 1: every rank a box
inside its node, colored by its group on that axis; groups spanning several nodes are hatched.
In SVG each box has the element id `rank-<axis>-g<group>-r<rank>`.

With `--vpp V` (and / or `--num-layers L`) and pp > 1 a last panel shows the model chunks: the
model's P*V virtual stages in model order, each drawn on the row of the pp rank that holds it.
Megatron's interleaved assignment: chunk c of pp rank r is virtual stage c*P + r, holding layers
[(c*P + r) * L/(P*V), ...) (0-based, even split). SVG id `chunk-p<rank>-c<chunk>-s<stage>`.
"""

from __future__ import annotations

import argparse
import sys

from gigatron.core.parallel_state import RankLayout, rank_layout
from gigatron.tools import _plotting
from gigatron.training.utils import args_by_name

AXES = ("tp", "cp", "ep", "dp", "pp")
_RANK_LAYOUT_ARGS = """tensor_model_parallel_size pipeline_model_parallel_size context_parallel_size
expert_model_parallel_size expert_tensor_parallel_size order"""
# The groups are listed rank by rank and the picture draws one box per rank per axis: above
# these sizes the tool refuses (or leaves the per-rank table out) rather than grow for minutes.
MAX_RANKS = 65_536  # ranks (and pp x vpp model chunks) listed
MAX_TABLE_RANKS = 4_096  # ranks in the per-rank table; above, the groups alone are printed
MAX_DRAWN_RANKS = 1_024  # ranks in a picture (--out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gigatron layout", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, required=True, help="number of ranks (GPUs)")
    # each size also under its training flag, parsed to that flag's dest (rank_layout's names)
    for short, megatron, default, what in (
        ("--tp", "--tensor-model-parallel-size", 1, "tensor model parallel size"),
        ("--pp", "--pipeline-model-parallel-size", 1, "pipeline model parallel size"),
        ("--cp", "--context-parallel-size", 1, "context parallel size"),
        ("--ep", "--expert-model-parallel-size", 1, "expert model parallel size"),
        ("--etp", "--expert-tensor-parallel-size", None, "expert tensor parallel size (= tp)"),
    ):  # fmt: skip
        dest = megatron[2:].replace("-", "_")
        p.add_argument(
            short, megatron, dest=dest, type=int, default=default, metavar="N", help=what
        )
    p.add_argument("--vpp", type=int, default=None, help="virtual pipeline stages per rank")
    p.add_argument("--num-layers", type=int, default=None, help="layers: each chunk's range")
    p.add_argument("--gpus-per-node", type=int, default=8, help="ranks per node (default 8)")
    p.add_argument("--order", default="tp-cp-ep-dp-pp", help="rank order, fastest axis first")
    p.add_argument("--out", default=None, help="picture file (.svg, .png or .pdf)")
    p.add_argument("--no-table", action="store_true", help="print only the groups, not each rank")
    return p


def describe(layout: RankLayout, gpus_per_node: int) -> dict:
    """The data behind the table and the picture.

    {"rows": [{"rank", "node", "tp", "cp", "ep", "dp", "pp"}], "axes": {axis: {"groups":
    [[ranks]], "crossing": [group indices spanning > 1 node]}}} over the axes of size > 1 (pp
    when every size is 1).
    """
    if gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node ({gpus_per_node}) must be >= 1")
    rows = []
    for rank in range(layout.world_size):
        rows.append({"rank": rank, "node": rank // gpus_per_node, **layout.coordinates(rank)})
    shown = [a for a in AXES if layout.sizes[a] > 1] or ["pp"]
    axes = {}
    for axis in shown:
        groups = layout.groups[axis]
        crossing = [i for i, g in enumerate(groups) if len({r // gpus_per_node for r in g}) > 1]
        axes[axis] = {"groups": groups, "crossing": crossing}
    return {"rows": rows, "axes": axes, "gpus_per_node": gpus_per_node}


def model_chunks(pp: int, vpp: int | None, num_layers: int | None) -> list[dict]:
    """Megatron's interleaved assignment, in model order: [{"stage", "pp_rank", "chunk",
    "layers": (first, last) or None}] for the pp * (vpp or 1) virtual stages; chunk c of pp rank
    r is virtual stage c*pp + r and holds layers [stage * L/(pp*vpp), (stage + 1) * L/(pp*vpp))."""
    v = vpp or 1
    if num_layers is not None and (num_layers < 1 or num_layers % (pp * v)):
        raise ValueError(
            f"--num-layers ({num_layers}) must be a positive multiple of --pp x --vpp "
            f"({pp} x {v} = {pp * v}): each virtual stage holds the same number of layers "
            "(uneven first/last stages are not drawn)"
        )
    per = num_layers // (pp * v) if num_layers else 0
    return [
        {"stage": s, "pp_rank": s % pp, "chunk": s // pp,
         "layers": (s * per, (s + 1) * per - 1) if per else None}
        for s in range(pp * v)
    ]  # fmt: skip


def _layers(chunk: dict) -> str:
    first, last = chunk["layers"]
    return f"layer {first}" if first == last else f"layers {first}-{last}"


def format_text(layout: RankLayout, data: dict, *, table: bool = True) -> str:
    s = layout.sizes
    num_nodes = -(-layout.world_size // data["gpus_per_node"])
    lines = [
        f"layout: world {layout.world_size} = tp {s['tp']} x cp {s['cp']} x dp {s['dp']} x "
        f"pp {s['pp']} (experts: ep {s['ep']} x expert-tp {s['etp']} x expert-dp "
        f"{s['expt-dp']} x pp {s['pp']}); order {layout.order.replace('-gtp_remat', '')}; "
        f"{data['gpus_per_node']} ranks per node, {num_nodes} node(s)"
    ]
    chunks = data.get("chunks")
    if chunks:
        v = 1 + max(c["chunk"] for c in chunks)
        lines.append(f"model chunks (vpp {v}: chunk c of pp rank r is virtual stage c*pp + r):")
        for r in range(s["pp"]):
            mine = [c for c in chunks if c["pp_rank"] == r]
            lines.append(f"  pp {r}: " + "; ".join(
                f"chunk {c['chunk']} = stage {c['stage']}"
                + (f" ({_layers(c)})" if c["layers"] else "") for c in mine
            ))  # fmt: skip
    if table:
        lines.append("rank  node    tp    cp    ep    dp    pp")
        for row in data["rows"]:
            lines.append("".join(f"{row[k]:>4}  " for k in ("rank", "node", *AXES)).rstrip())
    for axis, info in data["axes"].items():
        groups, crossing = info["groups"], info["crossing"]
        lines.append(
            f"{axis} groups: {len(groups)} of {len(groups[0])} ranks, "
            f"{len(crossing)} spanning several nodes"
        )
        marks = set(crossing)
        lines.append(
            "  " + " ".join(f"{g}{'*' if i in marks else ''}" for i, g in enumerate(groups))
        )
    if any(info["crossing"] for info in data["axes"].values()):
        lines.append("(* = the group spans several nodes: its traffic crosses the network)")
    return "\n".join(lines)


def draw(data: dict, out: str) -> None:
    """One panel per shown axis; nodes side by side (up to 8 per row), ranks in 8-wide rows."""
    plt = _plotting.pyplot()
    from matplotlib.patches import Rectangle

    rows, gpn = data["rows"], data["gpus_per_node"]
    num_nodes = -(-len(rows) // gpn)
    per_row_in_node = min(gpn, 8)
    node_w, node_h = per_row_in_node, -(-gpn // per_row_in_node)
    nodes_per_line = min(num_nodes, 8)
    lines_of_nodes = -(-num_nodes // nodes_per_line)
    width, height = nodes_per_line * (node_w + 1), lines_of_nodes * (node_h + 1)
    axes_info, chunks = data["axes"], data.get("chunks")
    scale = min(1.0, 24 / max(width, 1))
    panel_h = [height * 0.55 * scale + 1] * len(axes_info)
    if chunks:
        pp = 1 + max(c["pp_rank"] for c in chunks)
        width = max(width, len(chunks) * 1.2)
        panel_h.append(pp * 0.7 + 1.2)
    fig, axs = plt.subplots(
        len(panel_h), 1, squeeze=False, height_ratios=panel_h,
        figsize=(max(4.0, width * 0.55 * scale + 1), sum(panel_h)),
    )  # fmt: skip
    if chunks:
        _draw_chunks(axs[-1, 0], chunks)
    label = len(rows) <= 128
    for ax, (axis, info) in zip(axs[:, 0], axes_info.items()):
        colors = _plotting.group_colors(len(info["groups"]))
        crossing = set(info["crossing"])
        for n in range(num_nodes):
            x0, y0 = _node_origin(n, nodes_per_line, node_w, node_h)
            box = (x0 - 0.15, y0 - 0.15), node_w + 0.3, node_h + 0.3
            ax.add_patch(Rectangle(*box, fill=False, lw=1.2, ec="0.3", gid=f"node-{axis}-{n}"))
            if num_nodes <= 32:
                ax.text(x0, y0 - 0.25, f"node {n}", fontsize=7, va="bottom", color="0.3")
        for gi, group in enumerate(info["groups"]):
            for rank in group:
                n, local = divmod(rank, gpn)
                x0, y0 = _node_origin(n, nodes_per_line, node_w, node_h)
                x, y = x0 + local % per_row_in_node, y0 + local // per_row_in_node
                ax.add_patch(Rectangle(
                    (x + 0.05, y + 0.05), 0.9, 0.9, fc=colors[gi], ec="0.2", lw=0.4,
                    hatch="//" if gi in crossing else None, gid=f"rank-{axis}-g{gi}-r{rank}",
                ))  # fmt: skip
                if label:
                    ax.text(x + 0.5, y + 0.5, str(rank), ha="center", va="center", fontsize=6)
        ax.set_xlim(-0.5, width)
        ax.set_ylim(height, -0.8)
        ax.set_aspect("equal")
        ax.axis("off")
        size = len(info["groups"][0])
        ax.set_title(
            f"{axis} groups: {len(info['groups'])} x {size} ranks (color = group; "
            f"hatched: spans nodes, {len(crossing)})", fontsize=9,
        )  # fmt: skip
    _plotting.save(fig, out)


def _draw_chunks(ax, chunks: list[dict]) -> None:
    """Virtual stages left to right in model order, each on its pp rank's row, colored by chunk."""
    from matplotlib.patches import Rectangle

    pp = 1 + max(c["pp_rank"] for c in chunks)
    colors = _plotting.group_colors(1 + max(c["chunk"] for c in chunks))
    w = 1.2
    for c in chunks:
        x, y = c["stage"] * w, c["pp_rank"] * 0.7
        ax.add_patch(Rectangle(
            (x + 0.04, y + 0.04), w - 0.08, 0.62, fc=colors[c["chunk"]], ec="0.2", lw=0.5,
            gid=f"chunk-p{c['pp_rank']}-c{c['chunk']}-s{c['stage']}",
        ))  # fmt: skip
        label = f"stage {c['stage']}\nchunk {c['chunk']}" + (
            f"\n{_layers(c)}" if c["layers"] else ""
        )
        ax.text(x + w / 2, y + 0.35, label, ha="center", va="center", fontsize=5.5)
    for r in range(pp):
        ax.text(-0.1, r * 0.7 + 0.35, f"pp {r}", ha="right", va="center", fontsize=7)
    ax.set_xlim(-1.0, len(chunks) * w)
    ax.set_ylim(pp * 0.7, -0.1)
    ax.axis("off")
    ax.set_title(
        "model chunks: virtual stages in model order (left to right) on the pp rank that holds "
        "them; chunk c of rank r = stage c*pp + r", fontsize=8,
    )  # fmt: skip


def _node_origin(n: int, nodes_per_line: int, node_w: int, node_h: int) -> tuple[int, int]:
    return (n % nodes_per_line) * (node_w + 1), (n // nodes_per_line) * (node_h + 1)


def _check_sizes(args) -> None:
    """One line for a world size below 1 or above the listed / drawn limits."""
    if args.world_size < 1:
        raise ValueError(f"--world-size ({args.world_size}) must be >= 1")
    if args.world_size > MAX_RANKS:
        raise ValueError(
            f"--world-size ({args.world_size}) is above gigatron layout's {MAX_RANKS:,} ranks "
            "(every group is listed rank by rank)"
        )
    pp, vpp = args.pipeline_model_parallel_size, args.vpp
    if vpp is not None and pp * vpp > MAX_RANKS:
        raise ValueError(
            f"--pp x --vpp ({pp} x {vpp}) is above gigatron layout's {MAX_RANKS:,} "
            "model chunks (each is listed)"
        )
    if args.out and args.world_size > MAX_DRAWN_RANKS:
        raise ValueError(
            f"--out {args.out}: a picture of {args.world_size} ranks is above the "
            f"{MAX_DRAWN_RANKS:,} drawn (one box per rank per axis); leave out --out for the "
            "text, or draw a smaller world of the same shape"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    _plotting.check_out(args.out)
    _check_sizes(args)
    pp, vpp = args.pipeline_model_parallel_size, args.vpp
    if vpp is not None and (pp <= 1 or vpp < 1):
        raise ValueError(
            f"--vpp ({vpp}) needs --pp > 1 (got {pp}) and must be >= 1, as "
            "virtual_pipeline_model_parallel_size does"
        )
    layout = rank_layout(args.world_size, **args_by_name(args, _RANK_LAYOUT_ARGS))
    data = describe(layout, args.gpus_per_node)
    if pp > 1 and (vpp is not None or args.num_layers is not None):
        data["chunks"] = model_chunks(pp, vpp, args.num_layers)
    table = not args.no_table and args.world_size <= MAX_TABLE_RANKS
    print(format_text(layout, data, table=table))
    if not args.no_table and not table:
        print(f"(per-rank table left out: {args.world_size} ranks, above {MAX_TABLE_RANKS:,})")
    if args.out:
        draw(data, args.out)
        print(f"picture: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

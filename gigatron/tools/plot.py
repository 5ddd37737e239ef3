"""`gigatron plot RUN_DIR --out curves.png`: a run's curves vs iteration.

Training and validation loss, learning rate, grad norm and throughput (tokens/s), read from the
TensorBoard event files under RUN_DIR (`--tensorboard-dir`; TensorBoard's EventAccumulator) or,
without any, from a training log (RUN_DIR a log file, or the `*.log` / `*.txt` files in it:
the lines `gigatron train` prints).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from gigatron.tools import _plotting

# panel -> TensorBoard tag(s) gigatron's training log writes (training_log / log_validation)
PANELS = {
    "loss": ("lm loss", "lm loss validation"),
    "learning rate": ("learning-rate",),
    "grad norm": ("grad-norm",),
    "throughput (tokens/s)": ("tokens-per-sec",),
}
_LOG_KEYS = {
    "lm loss": r"\| lm loss: ([-+.\dEe]+)",
    "learning-rate": r"learning rate: ([-+.\dEe]+)",
    "grad-norm": r"grad norm: ([-+.\dEe]+)",
    "tokens-per-sec": r"tokens/s: ([-+.\dEe]+)",
}


def read_tensorboard(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value)]} of every scalar in the event files under `run_dir`."""
    files = sorted(run_dir.rglob("events.out.tfevents.*"))
    if not files:
        return {}
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ValueError(
            f"{run_dir} holds TensorBoard event files; reading them needs tensorboard: "
            "pip install 'gigatron[log]'"
        ) from None
    out: dict[str, dict[int, float]] = {}
    for d in sorted({f.parent for f in files}):
        acc = EventAccumulator(str(d), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for ev in acc.Scalars(tag):
                out.setdefault(tag, {})[ev.step] = ev.value  # a resumed run: the last write
    return {tag: sorted(v.items()) for tag, v in out.items()}


def read_log(path: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(iteration, value)]} from `gigatron train` log lines (TensorBoard's tag names)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = re.search(r"iteration\s+(\d+)/", line)
        if m:
            step = int(m.group(1))
            for tag, pattern in _LOG_KEYS.items():
                v = re.search(pattern, line)
                if v:
                    out.setdefault(tag, []).append((step, float(v.group(1))))
        v = re.search(r"validation loss at iteration (\d+)\s*\| lm loss value: ([-+.\dEe]+)", line)
        if v:
            out.setdefault("lm loss validation", []).append((int(v.group(1)), float(v.group(2))))
    return out


def read_run(run: str) -> dict[str, list[tuple[int, float]]]:
    path = Path(run)
    if not path.exists():
        raise FileNotFoundError(f"{run}: no such run directory or log file")
    if path.is_file():
        series = read_log(path)
    else:
        series = read_tensorboard(path)
        if not series:
            for log in sorted([*path.glob("*.log"), *path.glob("*.txt")]):
                series = read_log(log)
                if series:
                    break
    if not series:
        raise ValueError(
            f"{run}: found no scalars (TensorBoard event files from --tensorboard-dir, or a log "
            "with `iteration N/ M | ...` lines)"
        )
    return series


def draw(series: dict, out: str, title: str) -> None:
    plt = _plotting.pyplot()
    fig, axs = plt.subplots(2, 2, figsize=(10, 6.5))
    for ax, (panel, tags) in zip(axs.flat, PANELS.items()):
        drawn = False
        for tag in tags:
            points = series.get(tag)
            if points:
                steps, values = zip(*points)
                style = "o-" if "validation" in tag or len(points) < 30 else "-"
                ax.plot(steps, values, style, ms=3, lw=1.2, label=tag, gid=f"curve-{tag}")
                drawn = True
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("iteration", fontsize=8)
        ax.grid(alpha=0.3)
        if panel == "loss" and drawn:
            ax.legend(fontsize=8)
        if not drawn:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _plotting.save(fig, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gigatron plot", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a --tensorboard-dir directory (or a run directory holding one), "
                   "or a training log file")  # fmt: skip
    p.add_argument("--out", required=True, help="picture file (.png, .svg or .pdf)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    _plotting.check_out(args.out)
    series = read_run(args.run)
    draw(series, args.out, title=str(args.run))
    found = ", ".join(f"{tag} ({len(v)})" for tag, v in sorted(series.items()))
    print(f"plot: {args.out} from {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""matplotlib for the picture-drawing commands: imported on first use, Agg backend, one error."""

from __future__ import annotations

from pathlib import Path

FORMATS = (".svg", ".png", ".pdf")


def pyplot():
    """matplotlib.pyplot on the Agg backend; ValueError (one line) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError(
            "drawing pictures needs matplotlib: pip install 'gigatron[plot]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "gigatron"  # the same picture gives the same file
    import matplotlib.pyplot as plt

    return plt


def check_out(path: str | None) -> None:
    """ValueError unless `path` ends in .svg, .png or .pdf (before any work is done)."""
    if path is not None and Path(path).suffix.lower() not in FORMATS:
        raise ValueError(f"--out {path}: the picture's file name must end in one of {FORMATS}")


def save(fig, path: str) -> None:
    """Write `fig` (format from the suffix; SVG keeps each patch's gid as its element id)."""
    plt = pyplot()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata=_metadata(path))
    plt.close(fig)


def _metadata(path: str) -> dict:
    # fixed metadata: regenerated pictures differ only where the content does
    suffix = Path(path).suffix.lower()
    if suffix == ".svg":
        return {"Date": None, "Creator": "gigatron"}
    if suffix == ".pdf":
        return {"CreationDate": None, "Creator": "gigatron"}
    return {"Software": "gigatron"}


def group_colors(n: int) -> list:
    """`n` distinguishable colors (tab20, repeated past 20)."""
    plt = pyplot()
    cmap = plt.get_cmap("tab20")
    return [cmap(i % 20) for i in range(n)]

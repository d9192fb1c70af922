"""PNG plots of a bench summary (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import OVERALL


def write_plots(summary: dict[str, Any], out: Path, predicted: bool = False) -> list[str]:
    """Write ``speedup_by_category.png``, ``acceptance_by_depth.png`` and, where prompts of several lengths ran,
    ``acceptance_by_context.png``; returns the file names. ``predicted``:
    the speed-ups are a replay's predictions (the axis says so)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    cols = summary["columns"]
    strategies = list(summary["strategies"])
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(cols)), 4))
    width = 0.8 / max(len(strategies), 1)
    for i, s in enumerate(strategies):
        cells = summary["strategies"][s]["by_column"]
        ys = [cells.get(c, {}).get("speedup") or 0 for c in cols]
        ax.bar([j + i * width for j in range(len(cols))], ys, width, label=s)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks([j + width * (len(strategies) - 1) / 2 for j in range(len(cols))])
    ax.set_xticklabels([c.replace(" conversation", "\nconversation") if c != OVERALL else "overall" for c in cols],
                       fontsize=8)
    ax.set_ylabel(("predicted " if predicted else "") + "speedup over none (×)")
    ax.set_title(("Predicted speedup" if predicted else "Speedup") + " by category and strategy")
    ax.legend(fontsize=8 if len(strategies) <= 12 else 5, ncol=1 if len(strategies) <= 12 else 2)
    fig.tight_layout()
    fig.savefig(out / "speedup_by_category.png", dpi=120)
    plt.close(fig)
    names.append("speedup_by_category.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    plotted = False
    for s in strategies:
        acc = summary["strategies"][s]["acceptance_by_depth"]
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, marker="o", label=s)
            plotted = True
    ax.set_xlabel("draft position")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("acceptance rate (accepted / drafted at that depth)")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance rate by draft position")
    if plotted:
        ax.legend(fontsize=8 if len(strategies) <= 12 else 5, ncol=1 if len(strategies) <= 12 else 2)
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_depth.png", dpi=120)
    plt.close(fig)
    names.append("acceptance_by_depth.png")
    if summary.get("by_context"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for s, cells in summary["by_context"].items():
            pts = [(c["context_tokens"], c["tau"]) for c in cells if c["tau"] is not None]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=s)
        ax.set_xscale("log")
        ax.set_xlabel("prompt length (tokens, mean of the bin)")
        ax.set_ylabel("τ (tokens per target forward)")
        ax.set_title("Acceptance by context length")
        ax.legend(fontsize=8 if len(strategies) <= 12 else 5)
        fig.tight_layout()
        fig.savefig(out / "acceptance_by_context.png", dpi=120)
        plt.close(fig)
        names.append("acceptance_by_context.png")
    return names


def write_surface_plot(surface: dict[str, Any], out: Path) -> str:
    """``speed_surface.png``: speed-up over none by imposed acceptance length (y) and draft length (x), a heatmap
    with each cell's value (:func:`specframe.bench.report.speed_surface`); returns the file name."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    als, ks = surface["al"], surface["k"]
    grid = np.full((len(als), len(ks)), np.nan)
    for i, al in enumerate(als):
        for j, k in enumerate(ks):
            cell = surface["cells"].get(f"{al:g}/{k}")
            if cell and cell.get("speedup") is not None:
                grid[i, j] = cell["speedup"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(ks), 1.0 + 0.6 * len(als)))
    im = ax.imshow(grid, origin="lower", cmap="RdYlGn", vmin=min(0.5, np.nanmin(grid)), vmax=max(1.5, np.nanmax(grid)),
                   aspect="auto")
    for i in range(len(als)):
        for j in range(len(ks)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(ks)), [str(k) for k in ks])
    ax.set_yticks(range(len(als)), [f"{al:g}" for al in als])
    ax.set_xlabel("draft length k")
    ax.set_ylabel("acceptance length AL (tokens / step)")
    ax.set_title("Speed-up over none at imposed acceptance (synthetic)")
    fig.colorbar(im, ax=ax, label="speed-up (×)")
    fig.tight_layout()
    fig.savefig(out / "speed_surface.png", dpi=120)
    plt.close(fig)
    return "speed_surface.png"

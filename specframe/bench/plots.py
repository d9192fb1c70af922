"""PNG plots of a bench summary (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import OVERALL


def write_plots(summary: dict[str, Any], out: Path, predicted: bool = False) -> list[str]:
    """Write ``speedup_by_category.png`` and ``acceptance_by_depth.png``; returns the file names. ``predicted``:
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
    return names

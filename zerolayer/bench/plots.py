"""Multi-panel plots: bars for scenarios that yield a few numbers per system, lines for sweeps.

Titles wrap to the figure's width and the layout makes room for them (matplotlib's constrained
layout), so a long title is never cut at the edges of a narrow figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def titled_figure(title: str, num_panels: int, panel_width_in: float) -> tuple[Any, Any]:
    """A figure of ``num_panels`` panels side by side under ``title`` (wrapped to the figure's
    width); returns (figure, the row of axes). Imports matplotlib (Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1,
        num_panels,
        figsize=(panel_width_in * num_panels, 4.2),
        squeeze=False,
        layout="constrained",
    )
    fig.suptitle(title, wrap=True)
    return fig, axes[0]


def save(fig: Any, path: Path) -> Path:
    """Writes ``fig`` to ``path`` as PNG (100 dpi) and closes it."""
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_bars(
    path: Path,
    title: str,
    panels: dict[str, dict[str, float]],
    ylabels: dict[str, str] | None = None,
) -> Path:
    """Writes a PNG with one bar panel per entry of ``panels`` (panel title -> bar name -> value),
    each bar labelled with its value.

    Args:
        ylabels: y-axis label per panel title (default none).
    """
    fig, axes = titled_figure(title, len(panels), 4.5)
    for ax, (name, bars) in zip(axes, panels.items(), strict=True):
        labels = list(bars)
        values = [bars[label] for label in labels]
        drawn = ax.bar(range(len(labels)), values, color=[f"C{i}" for i in range(len(labels))])
        ax.bar_label(drawn, labels=[f"{v:.4g}" for v in values], fontsize=8)
        ax.margins(y=0.1)  # room above the tallest bar for its label
        if min(values, default=0) >= 0:
            ax.set_ylim(bottom=0)  # an all-zero panel too (no axis below zero)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(name, fontsize=10, wrap=True)
        ax.set_ylabel((ylabels or {}).get(name, ""))
        ax.grid(axis="y", alpha=0.3)
    return save(fig, path)


def plot_line_panels(
    path: Path,
    title: str,
    xlabel: str,
    panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
    ylabels: dict[str, str] | None = None,
) -> Path:
    """Writes a PNG with one line panel per entry of ``panels`` (panel title -> series name ->
    (xs, ys))."""
    fig, axes = titled_figure(title, len(panels), 5.5)
    for ax, (name, series) in zip(axes, panels.items(), strict=True):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(title=name, xlabel=xlabel, ylabel=(ylabels or {}).get(name, ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, path)

"""Multi-panel plots: bars for scenarios that yield a few numbers per system, lines for sweeps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.2), squeeze=False)
    for ax, (name, bars) in zip(axes[0], panels.items(), strict=True):
        labels = list(bars)
        values = [bars[label] for label in labels]
        drawn = ax.bar(range(len(labels)), values, color=[f"C{i}" for i in range(len(labels))])
        ax.bar_label(drawn, labels=[f"{v:.3g}" for v in values], fontsize=8)
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel((ylabels or {}).get(name, ""))
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_line_panels(
    path: Path,
    title: str,
    xlabel: str,
    panels: dict[str, dict[str, tuple[Sequence[float], Sequence[float]]]],
    ylabels: dict[str, str] | None = None,
) -> Path:
    """Writes a PNG with one line panel per entry of ``panels`` (panel title -> series name ->
    (xs, ys))."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (name, series) in zip(axes[0], panels.items(), strict=True):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.set(title=name, xlabel=xlabel, ylabel=(ylabels or {}).get(name, ""))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

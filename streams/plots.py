"""The charts the CLI draws (``loopwatch backtest --plot``, and any later command's): counts
over event time, one series per config, as PNG.

What every chart here does, so that a person can read it whatever the data:

* every point has a marker: a series of one minute is a dot, not an invisible line of no
  length; two series that agree stay apart (hollow circles under filled squares, a dashed
  line over a solid one);
* the time axis spans the data (padded by a bucket, or a few percent of a long span): a
  single minute is not drawn on matplotlib's default four-year axis for a date range of
  width zero; ticks by ``ConciseDateFormatter`` (times, with the date once);
* both axes say what is on them, with units;
* the plotting area is at a fixed place of a fixed-size picture (``FIGSIZE``, ``DPI``,
  ``AXES_BOX``) and the legend outside it, so a test can look at the area's pixels alone
  (``axes_pixels``) and find each series' colour there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["AXES_BOX", "DPI", "FIGSIZE", "PlotError", "Series", "axes_pixels", "counts_per_bucket", "save", "time_chart"]

FIGSIZE = (11.0, 5.0)
DPI = 100
AXES_BOX = (0.07, 0.24, 0.9, 0.64)
"""The plotting area: left, bottom, width, height as fractions of the picture."""
BASELINE_COLOR, CANDIDATE_COLOR = "#1f77b4", "#d62728"


class PlotError(Exception):
    """A chart that cannot be drawn or written; the message is one line for the user."""


@dataclass(frozen=True)
class Series:
    """One line of a chart: ``y[i]`` at ``times_s[i]`` (epoch seconds, UTC)."""

    label: str
    times_s: Sequence[float]
    y: Sequence[float]
    color: str
    hollow: bool = False
    """Hollow circles on a solid line (drawn first); else filled squares on a dashed line."""


def counts_per_bucket(counts: Sequence[Mapping[int, int]], bucket_s: float) -> tuple[list[float], list[list[int]]]:
    """Counters keyed by bucket number (``time // bucket_s``) as one time axis (every bucket
    from the first to the last of any of them, in epoch seconds) and each counter's values on
    it, 0 where it has none."""
    buckets = sorted(set().union(*counts))
    if not buckets:
        return [], [[] for _ in counts]
    span = range(buckets[0], buckets[-1] + 1)
    return [b * bucket_s for b in span], [[c.get(b, 0) for b in span] for c in counts]


def time_chart(series: Sequence[Series], *, title: str, ylabel: str, bucket_s: float,
               xlabel: str = "event time (UTC)", empty: str = "nothing to draw") -> Any:
    """The chart as a matplotlib Figure (Agg, not shown): ``save`` writes it."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'loopwatch[ops]'") from None
    matplotlib.use("Agg")
    from datetime import datetime, timezone

    import matplotlib.dates as mdates
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.add_axes(AXES_BOX)
    fig.suptitle(title, y=0.97)
    times = [t for s in series for t in s.times_s]
    if times:
        for s in sorted(series, key=lambda s: not s.hollow):
            x = [datetime.fromtimestamp(t, timezone.utc) for t in s.times_s]
            if s.hollow:
                ax.plot(x, s.y, color=s.color, linestyle="-", linewidth=2.0, marker="o", markersize=8,
                        markerfacecolor="none", markeredgewidth=1.8, label=s.label, zorder=2)
            else:
                ax.plot(x, s.y, color=s.color, linestyle="--", linewidth=1.5, marker="s", markersize=4,
                        label=s.label, zorder=3)
        first, last = min(times), max(times)
        pad = max(bucket_s, (last - first) * 0.03)
        ax.set_xlim(datetime.fromtimestamp(first - pad, timezone.utc), datetime.fromtimestamp(last + pad, timezone.utc))
        top = max((v for s in series for v in s.y), default=0)
        ax.set_ylim(0, max(1, top) * 1.15)
        if bucket_s >= 60 and last - first + 2 * pad <= 12 * bucket_s:
            # a short span: a tick per bucket, never ticks between buckets (seconds that read as minutes)
            locator: Any = mdates.MinuteLocator(byminute=range(0, 60, max(1, int(bucket_s // 60))), tz=timezone.utc)
        else:
            locator = mdates.AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=10)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))
        fig.legend(loc="lower center", ncol=max(1, len(series)), frameon=False, bbox_to_anchor=(0.5, 0.02))
    else:
        ax.set_ylim(0, 1)
        ax.set_xticks([])
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", color="0.4")
    ax.set_xlabel(xlabel + (f", {_duration(bucket_s)} buckets" if times else ""))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}-hour"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}-minute"
    return f"{seconds:g}-second"


def save(fig: Any, path: Path) -> None:
    """Write the chart as PNG (``FIGSIZE`` at ``DPI``, not cropped: ``AXES_BOX`` stays put)."""
    try:
        fig.savefig(path, format="png", dpi=DPI)
    except OSError as exc:
        raise PlotError(f"cannot write {path}: {exc.strerror or exc}") from None


def axes_pixels(image: Any) -> Any:
    """The plotting area of a picture ``save`` wrote (an array of rows of pixels, as
    ``matplotlib.image.imread`` reads it): ``AXES_BOX``, its frame left out."""
    height, width = image.shape[:2]
    left, bottom, w, h = AXES_BOX
    top_row = int(round((1 - bottom - h) * height)) + 2
    bottom_row = int(round((1 - bottom) * height)) - 2
    return image[top_row:bottom_row, int(round(left * width)) + 2:int(round((left + w) * width)) - 2]

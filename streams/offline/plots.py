"""The charts the CLI draws, as PNG: counts over event time, one series per config
(``time_chart``: ``loopwatch backtest --plot``), and points of two rates, one colour per row
(``scatter_chart``: ``loopwatch evaluate --plot``).

What every chart here does, so that a person can read it whatever the data:

* every point has a marker: a series of one minute is a dot, not an invisible line of no
  length; two series that agree stay apart (hollow circles under filled squares, a dashed
  line over a solid one);
* the time axis spans the data (padded by a bucket, or a few percent of a long span): a
  single minute is not drawn on matplotlib's default four-year axis for a date range of
  width zero; ticks by ``ConciseDateFormatter`` (times, with the date once);
* both axes say what is on them, with units;
* rows of a scatter chart that fall on the same point are set side by side (a few points
  apart, in the picture), not drawn over each other, and the axes are padded so that a
  point on an axis's end is drawn whole;
* the plotting area is at a fixed place of a fixed-size picture (``FIGSIZE``, ``DPI``,
  ``AXES_BOX``, ``SCATTER_BOX``) and the legend outside it, so a test can look at the area's
  pixels alone (``axes_pixels``) and find each series' colour there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from schemas.errors import LoopwatchError

__all__ = [
    "AXES_BOX",
    "DPI",
    "FIGSIZE",
    "Marker",
    "PlotError",
    "Points",
    "ROW_COLORS",
    "ROW_MARKERS",
    "SCATTER_BOX",
    "Spread",
    "Series",
    "axes_pixels",
    "counts_per_bucket",
    "distribution_chart",
    "row_styles",
    "save",
    "scatter_chart",
    "time_chart",
]

FIGSIZE = (11.0, 5.0)
DPI = 100
AXES_BOX = (0.07, 0.24, 0.9, 0.64)
"""The plotting area: left, bottom, width, height as fractions of the picture."""
SCATTER_BOX = (0.07, 0.12, 0.5, 0.76)
"""A scatter chart's plotting area: the legend of its rows takes the right of the picture."""
BASELINE_COLOR, CANDIDATE_COLOR = "#1f77b4", "#d62728"
ROW_COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
"""A scatter chart's rows, in turn (matplotlib's tab10: told apart at a glance and by a test);
``row_styles`` gives more rows colours of their own."""
ROW_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "p", "h", "8", "d", "H")
"""A scatter chart's rows' marker shapes, in turn; ``row_styles`` draws regular polygons and
stars for more rows."""
DODGE_PT = 12.0
"""How far apart rows on the same point are set, in points of the picture."""


class PlotError(LoopwatchError):
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


def row_styles(count: int) -> list[tuple[str, Any]]:
    """A colour and a marker shape for each of ``count`` rows, no two rows alike in either: up
    to 10 rows tab10's colours (``ROW_COLORS``), beyond that hues evenly spread round the
    colour wheel at two lightnesses; ``ROW_MARKERS`` in turn, then regular polygons and stars
    of 3 to 10 sides at growing angles (matplotlib's ``(sides, style, angle)`` markers)."""
    import colorsys

    if count <= len(ROW_COLORS):
        colors = list(ROW_COLORS[:count])
    else:
        colors = []
        for i in range(count):
            r, g, b = colorsys.hsv_to_rgb(i / count, 0.85, 0.95 if i % 2 else 0.65)
            colors.append(f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}")
    shapes: list[Any] = []
    for i in range(count):
        if i < len(ROW_MARKERS):
            shapes.append(ROW_MARKERS[i])
        else:
            j = i - len(ROW_MARKERS)
            shapes.append((3 + j % 8, (j // 8) % 2, 7.5 * (j // 16)))
    return list(zip(colors, shapes))


def counts_per_bucket(counts: Sequence[Mapping[int, int]], bucket_s: float) -> tuple[list[float], list[list[int]]]:
    """Counters keyed by bucket number (``time // bucket_s``) as one time axis (every bucket
    from the first to the last of any of them, in epoch seconds) and each counter's values on
    it, 0 where it has none."""
    buckets = sorted(set().union(*counts))
    if not buckets:
        return [], [[] for _ in counts]
    span = range(buckets[0], buckets[-1] + 1)
    return [b * bucket_s for b in span], [[c.get(b, 0) for b in span] for c in counts]


def time_chart(
    series: Sequence[Series],
    *,
    title: str,
    ylabel: str,
    bucket_s: float,
    xlabel: str = "event time (UTC)",
    empty: str = "nothing to draw",
) -> Any:
    """The chart as a matplotlib Figure (Agg, not shown): ``save`` writes it."""
    fig, ax = _figure(AXES_BOX, title)
    from datetime import datetime

    import matplotlib.dates as mdates

    times = [t for s in series for t in s.times_s]
    if times:
        for s in sorted(series, key=lambda s: not s.hollow):
            x = [datetime.fromtimestamp(t, UTC) for t in s.times_s]
            if s.hollow:
                ax.plot(
                    x,
                    s.y,
                    color=s.color,
                    linestyle="-",
                    linewidth=2.0,
                    marker="o",
                    markersize=8,
                    markerfacecolor="none",
                    markeredgewidth=1.8,
                    label=s.label,
                    zorder=2,
                )
            else:
                ax.plot(
                    x,
                    s.y,
                    color=s.color,
                    linestyle="--",
                    linewidth=1.5,
                    marker="s",
                    markersize=4,
                    label=s.label,
                    zorder=3,
                )
        first, last = min(times), max(times)
        pad = max(bucket_s, (last - first) * 0.03)
        ax.set_xlim(datetime.fromtimestamp(first - pad, UTC), datetime.fromtimestamp(last + pad, UTC))
        top = max((v for s in series for v in s.y), default=0)
        ax.set_ylim(0, max(1, top) * 1.15)
        if bucket_s >= 60 and last - first + 2 * pad <= 12 * bucket_s:
            # a short span: a tick per bucket, never ticks between buckets (seconds that read as minutes)
            locator: Any = mdates.MinuteLocator(byminute=range(0, 60, max(1, int(bucket_s // 60))), tz=UTC)
        else:
            locator = mdates.AutoDateLocator(tz=UTC, minticks=3, maxticks=10)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
        fig.legend(loc="lower center", ncol=max(1, len(series)), frameon=False, bbox_to_anchor=(0.5, 0.02))
    else:
        ax.set_ylim(0, 1)
        ax.set_xticks([])
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", color="0.4")
    ax.set_xlabel(xlabel + (f", {_duration(bucket_s)} buckets" if times else ""))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig


@dataclass(frozen=True)
class Marker:
    """What a kind of point looks like: a matplotlib marker, its width in points, its legend."""

    shape: str
    size: float
    label: str


@dataclass(frozen=True)
class Points:
    """One row of a scatter chart: ``(x, y, kind)`` points (kind: a key of the chart's
    markers), all in the row's colour."""

    label: str
    points: Sequence[tuple[float, float, str]]
    color: str
    shape: Any = None
    """The row's own marker shape (``row_styles``); None: each kind's (``Marker.shape``)."""


def scatter_chart(
    rows: Sequence[Points],
    *,
    markers: Mapping[str, Marker],
    title: str,
    xlabel: str,
    ylabel: str,
    y_range: tuple[float, float] = (0.0, 100.0),
    empty: str = "nothing to draw",
) -> Any:
    """The chart as a matplotlib Figure (Agg, not shown): ``save`` writes it.  The x axis runs
    from 0 to the largest x (1 if none is above 0); kinds are drawn largest first, so a row's
    points of several kinds on one place nest; rows on the same point and kind are set side by
    side (``DODGE_PT``)."""
    fig, ax = _figure(SCATTER_BOX, title)
    from matplotlib.lines import Line2D
    from matplotlib.transforms import ScaledTranslation

    at: dict[tuple[float, float, str], list[int]] = {}
    for i, row in enumerate(rows):
        for x, y, kind in row.points:
            at.setdefault((x, y, kind), []).append(i)
    order = sorted(markers, key=lambda kind: -markers[kind].size)
    own_shapes = any(row.shape is not None for row in rows)
    for kind in order:
        marker = markers[kind]
        for (x, y, k), here in at.items():
            if k != kind:
                continue
            for place, i in enumerate(here):
                shift = ScaledTranslation((place - (len(here) - 1) / 2) * DODGE_PT / 72, 0, fig.dpi_scale_trans)
                ax.plot(
                    [x],
                    [y],
                    linestyle="none",
                    marker=marker.shape if rows[i].shape is None else rows[i].shape,
                    markersize=marker.size,
                    color=rows[i].color,
                    markeredgecolor="black",
                    markeredgewidth=0.8,
                    transform=ax.transData + shift,
                    zorder=3,
                )
    # room for the widest group of side-by-side points and the largest marker, at either end
    widest = max((len(here) for here in at.values()), default=1)
    reach_px = ((widest - 1) / 2 * DODGE_PT + max((m.size for m in markers.values()), default=0) / 2 + 3) * DPI / 72
    top = max([x for x, _y, _k in at] + [0.0]) or 1.0
    width_px, height_px = FIGSIZE[0] * DPI * SCATTER_BOX[2], FIGSIZE[1] * DPI * SCATTER_BOX[3]
    xpad = top * reach_px / (width_px - 2 * reach_px)
    low, high = y_range
    ypad = (high - low) * reach_px / (height_px - 2 * reach_px)
    ax.set_xlim(-xpad, top + xpad)
    ax.set_ylim(low - ypad, high + ypad)
    if not at:
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", color="0.4")
    right = SCATTER_BOX[0] + SCATTER_BOX[2] + 0.015
    legend = fig.legend(
        handles=[
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o" if row.shape is None else row.shape,
                markersize=9,
                color=row.color,
                markeredgecolor="black",
                label=row.label,
            )
            for row in rows
        ],
        loc="upper left",
        bbox_to_anchor=(right, SCATTER_BOX[1] + SCATTER_BOX[3]),
        frameon=False,
        fontsize=8,
    )
    fig.add_artist(legend)
    fig.legend(
        handles=[
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o" if own_shapes else markers[k].shape,
                markersize=markers[k].size,
                color="white",
                markeredgecolor="black",
                label=markers[k].label,
            )
            for k in order
        ],
        loc="lower left",
        bbox_to_anchor=(right, SCATTER_BOX[1]),
        frameon=False,
        fontsize=8,
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig


@dataclass(frozen=True)
class Spread:
    """One row of a distribution chart: its percentiles (25, 50, 75, 90; None: no values),
    its colour and marker shape."""

    label: str
    p25: float | None
    p50: float | None
    p75: float | None
    p90: float | None
    color: str
    shape: Any = "o"


def distribution_chart(rows: Sequence[Spread], *, title: str, xlabel: str, empty: str = "nothing to draw") -> Any:
    """Each row on a line of its own: a thick bar from its 25th to its 75th percentile, a thin
    one on to its 90th, its median as its marker (``save`` writes it)."""
    fig, ax = _figure(SCATTER_BOX, title)
    drawn = [r for r in rows if r.p50 is not None]
    top = 1.0
    for y, row in enumerate(rows):
        if row.p50 is None:
            ax.text(0, y, "  nothing caught", va="center", color="0.4", fontsize=8)
            continue
        p25, p75 = row.p25 or 0.0, row.p75 or 0.0
        p90 = row.p90 if row.p90 is not None else p75
        ax.plot([p25, p90], [y, y], color=row.color, linewidth=1.5, zorder=2)
        ax.plot([p25, p75], [y, y], color=row.color, linewidth=7, solid_capstyle="butt", zorder=2)
        ax.plot(
            [row.p50],
            [y],
            linestyle="none",
            marker=row.shape,
            markersize=11,
            color=row.color,
            markeredgecolor="black",
            markeredgewidth=0.8,
            zorder=3,
        )
        top = max(top, p90)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([""] * len(rows))
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(-0.5, top + 0.5)
    if not drawn:
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha="center", va="center", color="0.4")
    from matplotlib.lines import Line2D

    fig.legend(
        handles=[
            Line2D(
                [],
                [],
                linestyle="none",
                marker=r.shape,
                markersize=9,
                color=r.color,
                markeredgecolor="black",
                label=r.label,
            )
            for r in rows
        ],
        loc="upper left",
        bbox_to_anchor=(SCATTER_BOX[0] + SCATTER_BOX[2] + 0.015, SCATTER_BOX[1] + SCATTER_BOX[3]),
        frameon=False,
        fontsize=8,
    )
    ax.set_xlabel(xlabel)
    ax.set_ylabel("rows (top to bottom as in the legend)")
    ax.grid(alpha=0.3, axis="x")
    return fig


def _figure(box: tuple[float, float, float, float], title: str) -> tuple[Any, Any]:
    """A figure of ``FIGSIZE`` at ``DPI`` (Agg) with its plotting area at ``box`` and its title."""
    try:
        import matplotlib
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'loopwatch[ops]'") from None
    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    fig.suptitle(title, y=0.97)
    return fig, fig.add_axes(box)


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


def axes_pixels(image: Any, box: tuple[float, float, float, float] = AXES_BOX) -> Any:
    """The plotting area of a picture ``save`` wrote (an array of rows of pixels, as
    ``matplotlib.image.imread`` reads it): ``box`` (``AXES_BOX``, ``SCATTER_BOX`` for a
    scatter chart), its frame left out."""
    height, width = image.shape[:2]
    left, bottom, w, h = box
    top_row = int(round((1 - bottom - h) * height)) + 2
    bottom_row = int(round((1 - bottom) * height)) - 2
    return image[top_row:bottom_row, int(round(left * width)) + 2 : int(round((left + w) * width)) - 2]

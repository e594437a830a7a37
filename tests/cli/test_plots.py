"""The CLI's charts (``streams.offline.plots``; ``loopwatch backtest --plot``, ``loopwatch evaluate
--plot``) as a person sees them: each series (each row of a scatter chart) has marks inside
the plotting area of the PNG (pixels of its colour there, not only in the legend, which is
outside it), every point a marker, the time axis the data's span, the axes labelled.  Checked
on the pictures the code writes, and on the chart's artists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")  # the ops extra, which make install installs
from matplotlib.image import imread  # noqa: E402

from harness.cli import loopwatch  # noqa: E402
from streams.offline.plots import (  # noqa: E402
    BASELINE_COLOR,
    CANDIDATE_COLOR,
    ROW_COLORS,
    SCATTER_BOX,
    Marker,
    Points,
    Series,
    axes_pixels,
    counts_per_bucket,
    row_styles,
    save,
    scatter_chart,
    time_chart,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0 = 1_700_000_040  # a minute's start, epoch seconds


def rgb(color: str) -> tuple[float, float, float]:
    return tuple(int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))


def marks_of(png: Path, color: str, box=None) -> int:
    """Pixels of ``color`` (within antialiasing's reach) inside the plotting area."""
    image = imread(png)
    area = (axes_pixels(image) if box is None else axes_pixels(image, box))[..., :3]
    return int((abs(area - rgb(color)).max(axis=-1) < 0.1).sum())


def chart(tmp_path: Path, name: str, base: dict, cand: dict) -> tuple[Path, object]:
    times, (b, c) = counts_per_bucket((base, cand), 60)
    fig = time_chart(
        [Series("baseline", times, b, BASELINE_COLOR, hollow=True), Series("candidate", times, c, CANDIDATE_COLOR)],
        title="t",
        ylabel="verdicts per minute",
        bucket_s=60,
    )
    png = tmp_path / f"{name}.png"
    save(fig, png)
    return png, fig


@pytest.mark.parametrize(
    "name, base, cand",
    [
        # one minute: each series a single point (the chart that was empty before issue 30)
        ("one minute", {T0 // 60: 24}, {T0 // 60: 59}),
        # the same counts: both must stay visible where they coincide
        ("agreeing", {T0 // 60: 3, T0 // 60 + 1: 3}, {T0 // 60: 3, T0 // 60 + 1: 3}),
        # a short span, and a series that has a minute the other has not
        ("short span", {T0 // 60: 1, T0 // 60 + 2: 4}, {T0 // 60 + 1: 2}),
        # a long span (two days) with verdicts in three minutes
        ("long span", {T0 // 60: 5, T0 // 60 + 2880: 7}, {T0 // 60 + 1440: 9}),
    ],
)
def test_every_series_has_marks_in_the_picture_and_the_axis_spans_the_data(tmp_path, name, base, cand):
    png, fig = chart(tmp_path, name.replace(" ", "-"), base, cand)
    assert marks_of(png, BASELINE_COLOR) >= 15 and marks_of(png, CANDIDATE_COLOR) >= 8, name
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["baseline", "candidate"]
    assert all(line.get_marker() not in (None, "", "None", " ") for line in lines)
    minutes = sorted(set(base) | set(cand))
    span = (minutes[-1] - minutes[0]) * 60
    left, right = (matplotlib.dates.num2date(x).timestamp() for x in ax.get_xlim())
    pad = max(60, span * 0.03)
    assert (left, right) == pytest.approx((minutes[0] * 60 - pad, minutes[-1] * 60 + pad))
    assert ax.get_xlabel().startswith("event time (UTC)") and ax.get_ylabel() == "verdicts per minute"


def test_a_chart_with_nothing_to_draw_says_so(tmp_path):
    png, fig = chart(tmp_path, "empty", {}, {})
    assert marks_of(png, BASELINE_COLOR) == marks_of(png, CANDIDATE_COLOR) == 0
    assert [t.get_text() for t in fig.axes[0].texts] == ["nothing to draw"]


def test_the_backtest_plot_of_the_examples_shows_both_configs(tmp_path):
    # Every example trace: all would-fire verdicts fall in one minute of event time.
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(
        "tools:\n  loopDetection:\n    enabled: true\n    warningThreshold: 5\n    criticalThreshold: 8\n"
    )
    png = tmp_path / "would-fire.png"
    files = sorted(EXAMPLES.glob("*.jsonl"))
    proc = loopwatch(
        "backtest",
        *files,
        "--baseline",
        EXAMPLES / "loop-detection.yaml",
        "--candidate",
        candidate,
        "--plot",
        png,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    verdicts = json.loads(proc.stdout)["verdicts"]
    assert sum(verdicts["baseline"].values()) and sum(verdicts["candidate"].values())
    assert marks_of(png, BASELINE_COLOR) >= 15 and marks_of(png, CANDIDATE_COLOR) >= 8


# -- scatter charts (loopwatch evaluate --plot) -------------------------------------------------

MARKERS = {"3": Marker("o", 16, "3+"), "5": Marker("s", 10.5, "5+"), "10": Marker("^", 7.5, "10+")}


@pytest.mark.parametrize(
    "name, rows",
    [
        # five rows on one point with every kind: each must stay visible (set side by side)
        ("all on one point", [[(0.0, 0.0, k) for k in MARKERS]] * 5),
        # points on the axes' ends (x = the largest x, y = 0 and 100), a single point, a lone kind
        (
            "ends",
            [
                [(0.0, 100.0, "3"), (0.0, 100.0, "5")],
                [(25.0, 100.0, "3"), (25.0, 0.0, "5")],
                [(25.0, 0.0, "10")],
                [(25.0, 0.0, "5")],
                [(12.5, 50.0, "3")],
            ],
        ),
    ],
)
def test_every_row_of_a_scatter_chart_has_marks_in_the_picture(tmp_path, name, rows):
    points = [Points(f"row {i}", row, ROW_COLORS[i]) for i, row in enumerate(rows)]
    fig = scatter_chart(points, markers=MARKERS, title="t", xlabel="false-alarm rate, %", ylabel="catch rate, %")
    png = tmp_path / "scatter.png"
    save(fig, png)
    for i in range(len(rows)):
        assert marks_of(png, ROW_COLORS[i], SCATTER_BOX) >= 20, (name, i)
    assert marks_of(png, ROW_COLORS[len(rows)], SCATTER_BOX) == 0  # a colour no row has
    (ax,) = fig.axes
    assert all(line.get_marker() not in (None, "", "None", " ") for line in ax.get_lines())
    assert len(ax.get_lines()) == sum(len(row) for row in rows)
    assert ax.get_xlabel() == "false-alarm rate, %" and ax.get_ylabel() == "catch rate, %"


def test_a_scatter_chart_with_nothing_to_draw_says_so(tmp_path):
    fig = scatter_chart(
        [Points("row", [], ROW_COLORS[0])], markers=MARKERS, title="t", xlabel="x", ylabel="y", empty="no strict loops"
    )
    png = tmp_path / "empty.png"
    save(fig, png)
    assert marks_of(png, ROW_COLORS[0], SCATTER_BOX) == 0
    assert [t.get_text() for t in fig.axes[0].texts] == ["no strict loops"]


def test_the_evaluate_plot_shows_every_row(tmp_path):
    """The hand-made transcript (tests/cli/test_evaluate.py counts it): configurable-final
    catches nothing, the recommended config and Gemini CLI share their points, Roo Code and
    OpenHands share theirs; every one of the five rows has marks."""
    events = tmp_path / "events.jsonl"
    data = Path(__file__).resolve().parents[2] / "tests" / "data" / "transcripts" / "hand-made" / "loops.json"
    assert loopwatch("import", data, "-o", events).returncode == 0
    png = tmp_path / "evaluate.png"
    proc = loopwatch(
        "evaluate",
        events,
        "--profile",
        "configurable-final",
        "--config",
        EXAMPLES / "recommended.yaml",
        "--plot",
        png,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert len(rows) == 5
    for i, row in enumerate(rows):
        assert marks_of(png, ROW_COLORS[i], SCATTER_BOX) >= 20, row["name"]


def test_every_row_has_its_own_colour_and_marker_at_any_count():
    for count in (1, 10, 11, 16, 40, 120):
        styles = row_styles(count)
        assert len(styles) == count
        assert len({c for c, _m in styles}) == count, count
        assert len({repr(m) for _c, m in styles}) == count, count
    assert [c for c, _m in row_styles(10)] == list(ROW_COLORS)  # up to 10 rows: tab10


def test_fourteen_rows_each_with_marks_of_its_colour_and_its_own_marker(tmp_path):
    styles = row_styles(14)
    rows = [Points(f"row {i}", [(float(i), 50.0, "5")], color, shape) for i, (color, shape) in enumerate(styles)]
    fig = scatter_chart(rows, markers=MARKERS, title="t", xlabel="x, %", ylabel="y, %")
    png = tmp_path / "fourteen.png"
    save(fig, png)
    for i, (color, _shape) in enumerate(styles):
        assert marks_of(png, color, SCATTER_BOX) >= 15, i
    drawn = [(line.get_color(), repr(line.get_marker())) for line in fig.axes[0].get_lines()]
    assert sorted(drawn) == sorted((c, repr(m)) for c, m in styles)

"""What a run did, read back from the metrics tables: phases, cadence, freshness, a chart."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spark_jobs.backlog.freshness import EVENT_TIME_OBSERVATION, oldest_event_at
from spark_jobs.backlog.lag import OFFSETS_BEHIND_LATEST
from spark_jobs.metrics.schema import as_utc, backlog_checkpoints, backlog_transitions, make_engine


@dataclass(frozen=True)
class Checkpoint:
    """One committed micro-batch, with what the pipeline observed about its events."""

    batch_id: int
    started_at: float
    committed_at: float
    is_backlog: bool
    rows: int
    #: What the batch left behind: files of a landing directory, or offsets of a topic.
    behind: int | None
    event_time_quantiles_s: tuple[float, ...]
    #: The running child of the (first) hybrid source, and the rule behind its status.
    phase: str | None = None
    rule: str | None = None
    watermark: datetime | None = None
    #: Malformed files and records the batch set aside (None without a quarantine).
    quarantined: int | None = None
    #: Spark's time on the batch's data (addBatch), and the rest of its duration: the
    #: checkpoint's fixed cost (None: recorded without its parts, or recovered).
    data_ms: int | None = None
    fixed_cost_ms: int | None = None
    #: The state it carried, over its stateful operators (None: it kept none).
    state_disk_bytes: int | None = None
    state_rows: int | None = None
    #: The event time of its oldest row (None: no rows, or not observed).
    oldest_event_s: float | None = None
    #: The run (one launch of the job) that committed it, and the interval it ran at.
    run_id: str | None = None
    interval_ms: int | None = None

    @property
    def freshness_s(self) -> float | None:
        """Its commit minus its oldest row's event time: what a freshness target judges."""
        return None if self.oldest_event_s is None else self.committed_at - self.oldest_event_s

    @property
    def duration_s(self) -> float:
        return self.committed_at - self.started_at


def load(url: str, job: str) -> tuple[list[Checkpoint], list[dict]]:
    """Checkpoints (by batch) and transitions of one job."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(backlog_checkpoints)
                .where(backlog_checkpoints.c.job_name == job)
                .order_by(backlog_checkpoints.c.batch_id)
            ).all()
            changes = connection.execute(
                sa.select(backlog_transitions)
                .where(backlog_transitions.c.job_name == job)
                .order_by(backlog_transitions.c.at)
            ).all()
    finally:
        engine.dispose()
    return [_checkpoint(r._mapping) for r in rows], [dict(r._mapping) for r in changes]


def _checkpoint(row: sa.RowMapping) -> Checkpoint:
    committed = epoch(row["committed_at"])
    sources = json.loads(row["sources"])
    lags = [
        lag.get(OFFSETS_BEHIND_LATEST, lag.get("files_behind"))
        for lag in (s.get("lag", {}) for s in sources)
    ]
    metrics = json.loads(row["observed_metrics"] or "{}")
    observed = metrics.get(EVENT_TIME_OBSERVATION, {})
    quantiles = tuple(ms / 1000 for ms in observed.get("quantiles_ms") or ())
    return Checkpoint(
        batch_id=row["batch_id"],
        started_at=committed - row["batch_duration_ms"] / 1000,
        committed_at=committed,
        is_backlog=row["is_backlog"],
        rows=row["num_input_rows"],
        behind=next((lag for lag in lags if lag is not None), None),
        event_time_quantiles_s=quantiles if observed.get("rows") else (),
        phase=sources[0].get("phase") if sources else None,
        rule=sources[0].get("rule") if sources else None,
        watermark=as_utc(row["watermark"]),
        quarantined=row["quarantined"],
        data_ms=row["add_batch_ms"],
        fixed_cost_ms=None
        if row["add_batch_ms"] is None
        else row["batch_duration_ms"] - row["add_batch_ms"],
        state_disk_bytes=row["state_disk_bytes"],
        state_rows=row["state_rows_total"],
        oldest_event_s=oldest_event_at(metrics),
        run_id=row["run_id"],
        interval_ms=row["effective_interval_ms"],
    )


def epoch(value: datetime | str) -> float:
    moment = as_utc(value)
    assert moment is not None
    return moment.timestamp()


@dataclass(frozen=True)
class PhaseStats:
    checkpoints: int
    duration_s: float
    rows: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.duration_s if self.duration_s > 0 else 0.0


def phase_stats(checkpoints: Sequence[Checkpoint]) -> PhaseStats:
    """From the start of the phase's first batch to the commit of its last."""
    if not checkpoints:
        return PhaseStats(0, 0.0, 0)
    duration = checkpoints[-1].committed_at - checkpoints[0].started_at
    return PhaseStats(len(checkpoints), duration, sum(c.rows for c in checkpoints))


def warm_up_s(backlog: Sequence[Checkpoint]) -> float | None:
    """The first backlog batch's time beyond what its rows cost at the rate of the backlog
    batches after it: what a new driver's first batch pays to start (None with one batch)."""
    later = backlog[1:]
    if not later or not sum(c.rows for c in later):
        return None
    per_row = sum(c.duration_s for c in later) / sum(c.rows for c in later)
    return backlog[0].duration_s - backlog[0].rows * per_row


def cost_lines(checkpoints: Sequence[Checkpoint]) -> list[str]:
    """Per phase, the median checkpoint's fixed cost, its data work and the state it
    carried: the numbers an interval is tuned by, since a longer one spreads the fixed cost
    over more data. Checkpoints recorded without their parts are left out."""
    lines = [
        "where a checkpoint's time goes, median per phase:",
        f"{'phase':8}{'checkpoints':>12}{'fixed cost (ms)':>17}{'data (ms)':>11}"
        f"{'state on disk (B)':>19}{'state rows':>12}",
    ]
    for phase, is_backlog in (("backlog", True), ("live", False)):
        costed = [
            c for c in checkpoints if c.is_backlog is is_backlog and c.fixed_cost_ms is not None
        ]
        if costed:
            lines.append(
                f"{phase:8}{len(costed):>12,d}"
                f"{_median_text([c.fixed_cost_ms for c in costed]):>17}"
                f"{_median_text([c.data_ms for c in costed]):>11}"
                f"{_median_text([c.state_disk_bytes for c in costed]):>19}"
                f"{_median_text([c.state_rows for c in costed]):>12}"
            )
    return lines


def _median_text(values: Sequence[int | None]) -> str:
    known = [value for value in values if value is not None]
    return f"{statistics.median(known):,.0f}" if known else "-"


def periods(checkpoints: Sequence[Checkpoint]) -> list[list[Checkpoint]]:
    """Consecutive checkpoints of one job status: backlog, live, backlog again..."""
    return [list(group) for _, group in itertools.groupby(checkpoints, lambda c: c.is_backlog)]


def phase_changes(checkpoints: Sequence[Checkpoint]) -> list[tuple[float, str]]:
    """When the running child changed (a hybrid handoff), as chart marks."""
    return [
        (after.started_at, f"handoff: {before.phase} -> {after.phase}")
        for before, after in itertools.pairwise(checkpoints)
        if before.phase and after.phase and before.phase != after.phase
    ]


def caught_up(checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
    """Steady real time: the live checkpoints after the first one that left nothing behind.

    That first one still carries what piled up before (backlog or a per-batch limit).
    """
    live = [c for c in checkpoints if not c.is_backlog]
    for index, checkpoint in enumerate(live):
        if checkpoint.behind == 0:
            return live[index + 1 :]
    return []


def steady_live(run: Sequence[Checkpoint]) -> list[Checkpoint]:
    """Steady real time of one run: its live checkpoints committed in the second half of its
    live time. The first half serves what piled up before it (the backlog's tail, or the
    events that arrived while a relaunch handed over), at a freshness the interval does not
    set."""
    live = [c for c in run if not c.is_backlog]
    if not live:
        return []
    halfway = (live[0].committed_at + live[-1].committed_at) / 2
    return [c for c in live if c.committed_at >= halfway]


@dataclass(frozen=True)
class Reentry:
    """How a run answered a pile-up that started at ``burst_at`` (epoch seconds)."""

    detect_s: float | None
    recovery_to_live_s: float | None


def reentry(transitions: Sequence[dict], burst_at: float | None) -> Reentry:
    """From the start of the pile-up to the switch into backlog, and from there back to live."""
    if burst_at is None:
        return Reentry(None, None)
    after = [(epoch(t["at"]), bool(t["is_backlog"])) for t in transitions]
    after = [(at, backlog) for at, backlog in after if at >= burst_at]
    entered = next((at for at, backlog in after if backlog), None)
    if entered is None:
        return Reentry(None, None)
    left = next((at for at, backlog in after if not backlog and at > entered), None)
    return Reentry(entered - burst_at, None if left is None else left - entered)


def freshness_s(checkpoints: Sequence[Checkpoint]) -> list[tuple[float, float]]:
    """(seconds from event to commit, weight) pairs, from each batch's event-time quantiles."""
    samples = []
    for checkpoint in checkpoints:
        quantiles = checkpoint.event_time_quantiles_s
        for event_time in quantiles:
            samples.append((checkpoint.committed_at - event_time, checkpoint.rows / len(quantiles)))
    return samples


def weighted_percentile(samples: Sequence[tuple[float, float]], fraction: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    total = sum(weight for _, weight in ordered)
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= fraction * total:
            return value
    return ordered[-1][0]


def cadence_s(checkpoints: Sequence[Checkpoint]) -> list[float]:
    """Time between the starts of consecutive batches."""
    starts = [c.started_at for c in checkpoints]
    return [b - a for a, b in itertools.pairwise(starts)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def plot_timeline(
    runs: Sequence[tuple[str, Sequence[Checkpoint]]],
    path: Path,
    title: str,
    marks: Sequence[Sequence[tuple[float, str]]] = (),
) -> Path:
    """``timeline_figure`` written to ``path`` as a PNG."""
    return save_chart(timeline_figure(runs, title, marks), path)


def timeline_figure(
    runs: Sequence[tuple[str, Sequence[Checkpoint]]],
    title: str,
    marks: Sequence[Sequence[tuple[float, str]]] = (),
) -> Any:
    """One panel per run, on one time axis: a bar per batch (its rows, log scale, as long as
    it ran), backlog shaded, a grey line per checkpoint, and the median freshness of each
    live batch's events on a second axis. ``marks`` label moments (epoch seconds) per run:
    transitions, a burst. A mark is a dashed line through its panel; its label sits in a
    strip of its own above the bars (``place_labels``), where no bar can hide it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    panel_marks = [marks[index] if index < len(marks) else () for index in range(len(runs))]
    figure = plt.figure(figsize=(12, PANEL_IN * len(runs)), layout="constrained")
    panels = figure.add_gridspec(len(runs), 1)
    legend = [
        Patch(color=BACKLOG_COLOUR, label="backlog batch"),
        Patch(facecolor=BACKLOG_COLOUR, hatch="//", edgecolor="white", label="backlog by lag"),
        Patch(color=LIVE_COLOUR, label="live batch"),
        Line2D([], [], color=FRESHNESS_COLOUR, marker=".", label="live freshness p50"),
    ]
    shared = None
    strips: list[tuple[Any, Any, list[Any]] | None] = [None] * len(runs)
    for index, (label, checkpoints) in enumerate(runs):
        labelled = bool(checkpoints and panel_marks[index])
        cells = panels[index].subgridspec(2 if labelled else 1, 1)
        axis = figure.add_subplot(cells[-1], sharex=shared)
        shared = shared or axis
        strip = figure.add_subplot(cells[0], sharex=shared) if labelled else None
        (strip or axis).set_title(label if checkpoints else f"{label}: no checkpoints")
        axis.set_ylabel("rows per batch")
        if not checkpoints:
            continue
        origin = checkpoints[0].started_at
        _draw_batches(axis, checkpoints, origin)
        fresh = [
            (c.committed_at - origin, median([c.committed_at - t for t in quantiles]))
            for c in checkpoints
            if not c.is_backlog and (quantiles := c.event_time_quantiles_s)
        ]
        if fresh:
            twin = axis.twinx()
            twin.plot(*zip(*fresh, strict=True), ".-", color=FRESHNESS_COLOUR, lw=1, ms=3)
            twin.set_yscale("log")
            twin.set_ylabel("freshness p50 (s)", color=FRESHNESS_COLOUR)
        if strip is not None:
            strips[index] = (cells, strip, _draw_marks(strip, axis, panel_marks[index], origin))
    axis.set_xlabel("seconds since the first batch started (grey lines: checkpoints)")
    figure.suptitle(title)
    # Below the panels, once: inside one it could cover a tall bar.
    figure.legend(handles=legend, loc="outside lower center", ncols=len(legend), fontsize="small")
    _lay_out_labels(figure, panels, strips)
    return figure


def _draw_batches(axis: Any, checkpoints: Sequence[Checkpoint], origin: float) -> None:
    for checkpoint in checkpoints:
        if checkpoint.is_backlog:
            axis.axvspan(
                checkpoint.started_at - origin,
                checkpoint.committed_at - origin,
                color=BACKLOG_COLOUR,
                alpha=0.15,
                lw=0,
            )
        axis.bar(
            checkpoint.started_at - origin,
            max(checkpoint.rows, 1),
            width=max(checkpoint.duration_s, 0.05),
            align="edge",
            color=BACKLOG_COLOUR if checkpoint.is_backlog else LIVE_COLOUR,
            hatch="//" if checkpoint.is_backlog and checkpoint.rule in LAG_RULES else None,
            edgecolor="white",
            lw=0,
        )
        axis.axvline(checkpoint.committed_at - origin, color="#555555", lw=0.4, alpha=0.4)
    axis.set_yscale("log")


def _draw_marks(
    strip: Any, axis: Any, marks: Sequence[tuple[float, str]], origin: float
) -> list[Any]:
    """A dashed line per mark through the bars, and its label in the strip (in row 0 until
    ``_lay_out_labels`` places it and draws its line up to it)."""
    strip.tick_params(bottom=False, labelbottom=False, left=False, labelleft=False)
    for side in strip.spines.values():
        side.set_visible(False)
    labels = []
    for at, text in marks:
        axis.axvline(at - origin, color=MARK_COLOUR, lw=1, ls="--")
        labels.append(
            strip.annotate(
                text,
                (at - origin, 0),
                xytext=(LABEL_PAD_PT, 0),
                textcoords="offset points",
                ha="left",
                va="center",
                fontsize="x-small",
                color=MARK_COLOUR,
                # over the line of a mark whose label sits in a higher row
                bbox={"facecolor": "white", "lw": 0, "pad": 0.5},
            )
        )
    return labels


def _lay_out_labels(
    figure: Any, panels: Any, strips: Sequence[tuple[Any, Any, list[Any]] | None]
) -> None:
    """Measure the drawn labels, place them (``place_labels``) and size each panel's strip
    (None: it has no labels) to its rows; the figure grows by the strips' height."""
    figure.draw_without_rendering()
    points = figure.dpi / 72
    heights = []
    for panel in strips:
        if panel is None:
            heights.append(PANEL_IN)
            continue
        cells, strip, labels = panel
        box = strip.get_window_extent()
        marks_px = [strip.transData.transform((label.xy[0], 0))[0] for label in labels]
        widths = [label.get_window_extent().width + LABEL_PAD_PT * points for label in labels]
        places = place_labels(marks_px, widths, box.x1, LABEL_GAP_PT * points)
        for label, place in zip(labels, places, strict=True):
            label.xy = (label.xy[0], place.row)
            label.set_horizontalalignment("right" if place.leftward else "left")
            label.xyann = (-LABEL_PAD_PT if place.leftward else LABEL_PAD_PT, 0)
            strip.vlines(label.xy[0], -0.5, place.row, color=MARK_COLOUR, lw=1, ls="--")
        rows = 1 + max(place.row for place in places)
        strip.set_ylim(-0.5, rows - 0.5)
        cells.set_height_ratios([rows * LABEL_ROW_IN, PANEL_IN])
        heights.append(PANEL_IN + rows * LABEL_ROW_IN)
    panels.set_height_ratios(heights)
    figure.set_figheight(sum(heights) + LEGEND_IN)


@dataclass(frozen=True)
class LabelPlace:
    """Where a mark's label goes in the strip above its panel's bars."""

    #: 0 is the row nearest the bars.
    row: int
    #: It ends at its mark instead of starting there.
    leftward: bool


def place_labels(
    marks: Sequence[float], widths: Sequence[float], right: float, gap: float
) -> list[LabelPlace]:
    """Where each mark's label goes, all in one unit (pixels): beside its mark, to its right
    unless it would run past ``right`` (then to its left), in the lowest row where it starts
    at least ``gap`` after the label before it in that row ends. So no two labels touch, and
    they take as few rows as that allows. In the order of ``marks``."""
    spans = [
        (mark - width, width, True) if mark + width > right else (mark, width, False)
        for mark, width in zip(marks, widths, strict=True)
    ]
    row_ends: list[float] = []
    places: dict[int, LabelPlace] = {}
    for index in sorted(range(len(spans)), key=lambda i: spans[i][0]):
        start, width, leftward = spans[index]
        row = next((r for r, end in enumerate(row_ends) if end + gap <= start), len(row_ends))
        if row == len(row_ends):
            row_ends.append(start + width)
        else:
            row_ends[row] = start + width
        places[index] = LabelPlace(row, leftward)
    return [places[index] for index in range(len(spans))]


def save_chart(figure: Any, path: Path, dpi: int = 110) -> Path:
    """``figure`` laid out (tightly, unless it has a layout of its own) and written to
    ``path`` as a PNG, then closed."""
    import matplotlib.pyplot as plt

    if figure.get_layout_engine() is None:
        figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
    return path


#: A panel's height without its labels, a row of labels above it, and how far a label
#: keeps from its mark line and from the label before it in its row; the legend's row.
PANEL_IN = 3.4
LABEL_ROW_IN = 0.16
LEGEND_IN = 0.3
LABEL_PAD_PT = 2.0
LABEL_GAP_PT = 6.0
BACKLOG_COLOUR = "#b5651d"
LIVE_COLOUR = "#2b7bb9"
FRESHNESS_COLOUR = "#2ca02c"
MARK_COLOUR = "#7a1fa2"
LAG_RULES = ("offset-lag", "watermark-lag")

"""A job's period on one time axis: its phases shaded (hatched where a lag rule, not the
phase of a source, holds it in backlog), each checkpoint as a mark sized by the rows it
read, the effective checkpoint interval as a step line (with a mark, and its reason, where a
freshness target chose a new one), and what changed the job: its
transitions (numbered, as in the list under the chart), its runs' launches and ends, and
the requests made to it. Each mark carries a ``data-`` attribute saying what it is.
"""

from __future__ import annotations

import math

from markupsafe import Markup

from airflow_provider_backlog.hooks.metrics_reads import JobHistory
from airflow_provider_backlog.hooks.metrics_values import Checkpoint, IntervalChange
from airflow_provider_backlog.ui import fmt
from airflow_provider_backlog.ui.runs import Boundary, Span
from airflow_provider_backlog.ui.svg import (
    Scale,
    TimeScale,
    chart,
    element,
    number,
    time_axis,
    title,
)

WIDTH, LEFT, RIGHT = 960.0, 72.0, 16.0
TOP, BOTTOM = 28.0, 196.0
#: Where the interval's step line runs (its largest value at the top), and the marks' track.
INTERVAL_TOP, INTERVAL_ZERO = TOP + 8, TOP + 96
TRACK = TOP + 134
MIN_RADIUS, MAX_RADIUS = 2.0, 12.0
#: The glyph of each kind of run boundary, drawn at the foot of its line (x, y: its foot).
_GLYPHS = {
    "launch": "M{x},{top}l7,5l-7,5z",
    "end": "M{x},{top}h-7v10h7z",
    "death": "M{left},{top}l10,10m0,-10l-10,10",
    "takeover": "M{x},{top}l-7,5l7,5z",
}


def _hatch() -> Markup:
    stripe = element("line", {"class": "hatch", "x1": "0", "y1": "0", "x2": "0", "y2": "6"})
    pattern = element(
        "pattern",
        {
            "id": "lag-hatch",
            "width": "6",
            "height": "6",
            "patternUnits": "userSpaceOnUse",
            "patternTransform": "rotate(45)",
        },
        stripe,
    )
    return element("defs", None, pattern)


def _span(span: Span, x: TimeScale) -> Markup:
    held = "a lag rule held it" if span.held_by_lag else "the phase of a source held it"
    box = {"y": TOP, "height": BOTTOM - TOP, "x": x(span.start)}
    box["width"] = max(x(span.end) - box["x"], 1.0)
    shapes = [element("rect", {"class": "span backlog", **box})]
    if span.held_by_lag:
        shapes.append(element("rect", {"class": "span lag", "fill": "url(#lag-hatch)", **box}))
    text = (
        f"backlog from {fmt.utc(span.start)} to {fmt.utc(span.end)} "
        f"({fmt.duration(span.seconds)}), run {span.run_id}: {held}"
    )
    kind = "lag" if span.held_by_lag else "backlog"
    return element("g", {"data-span": kind}, title(text), *shapes)


def _interval_line(
    checkpoints: tuple[Checkpoint, ...], changes: tuple[IntervalChange, ...], x: TimeScale
) -> Markup:
    """Each checkpoint's interval, held from its commit to the next one of its run, and each
    interval a freshness target chose, where it was chosen."""
    known = [c.effective_interval_ms for c in checkpoints if c.effective_interval_ms is not None]
    known += [change.interval_ms for change in changes]
    if not known:
        return Markup("")
    y = Scale(0, max(known), INTERVAL_ZERO, INTERVAL_TOP)
    path, previous = [], None
    for checkpoint in checkpoints:
        value = checkpoint.effective_interval_ms
        if value is None:
            previous = None
            continue
        here = number(x(checkpoint.committed_at))
        if previous is not None and previous.run_id == checkpoint.run_id:
            path.append(f"H{here}V{number(y(value))}")
        else:
            path.append(f"M{here},{number(y(value))}")
        previous = checkpoint
    axis = [
        element("text", {"class": "tick end", "x": LEFT - 6, "y": y(v) + 4}, fmt.milliseconds(v))
        for v in (0, max(known))
    ]
    label = element("text", {"class": "tick end", "x": LEFT - 6, "y": TOP}, "interval")
    line = element("path", {"class": "interval", "d": "".join(path)})
    chosen = [
        element(
            "g",
            {"class": "interval-change", "data-interval-change": change.run_id},
            title(
                f"{fmt.utc(change.at)}, run {change.run_id}: interval "
                f"{fmt.milliseconds(change.interval_ms)}: {change.reason}"
            ),
            element("circle", {"cx": x(change.at), "cy": y(change.interval_ms), "r": 3}),
        )
        for change in changes
    ]
    return Markup("").join([*axis, label, line, *chosen])


def _checkpoint(checkpoint: Checkpoint, x: TimeScale, most_rows: int) -> Markup:
    share = checkpoint.num_input_rows / most_rows if most_rows else 0
    phase = "backlog" if checkpoint.is_backlog else "live"
    interval = checkpoint.effective_interval_ms
    text = (
        f"batch {checkpoint.batch_id} of run {checkpoint.run_id}, committed "
        f"{fmt.utc(checkpoint.committed_at)}: {phase}, {fmt.count(checkpoint.num_input_rows)} "
        f"rows in {fmt.milliseconds(checkpoint.batch_duration_ms)}, interval "
        + (fmt.milliseconds(interval) if interval is not None else "off")
        + (" (rebuilt by the next run after a crash)" if checkpoint.recovered else "")
    )
    attributes = {
        "class": f"checkpoint {phase}" + (" recovered" if checkpoint.recovered else ""),
        "data-checkpoint": f"{checkpoint.run_id}:{checkpoint.batch_id}",
        "cx": x(checkpoint.committed_at),
        "cy": TRACK,
        "r": MIN_RADIUS + (MAX_RADIUS - MIN_RADIUS) * math.sqrt(share),
    }
    return element("circle", attributes, title(text))


def _vertical(at_x: float, css: str) -> Markup:
    return element("line", {"class": css, "x1": at_x, "x2": at_x, "y1": TOP - 12, "y2": BOTTOM})


def _boundary(boundary: Boundary, x: TimeScale) -> Markup:
    at_x = x(boundary.at)
    glyph = _GLYPHS[boundary.kind].format(
        x=number(at_x), left=number(at_x - 5), top=number(BOTTOM - 12)
    )
    return element(
        "g",
        {
            "class": f"boundary {boundary.kind}",
            "data-boundary": boundary.kind,
            "data-run": boundary.run_id,
        },
        title(f"{fmt.utc(boundary.at)}: {boundary.text}"),
        _vertical(at_x, "boundary"),
        element("path", {"d": glyph}),
    )


def timeline(history: JobHistory, phases: list[Span], marks: list[Boundary]) -> Markup:
    """The chart of ``history``, with its ``spans`` and its runs' ``boundaries``."""
    x = TimeScale(history.since, history.until, LEFT, WIDTH - RIGHT)
    most_rows = max((c.num_input_rows for c in history.checkpoints), default=0)
    parts = [
        _hatch(),
        *(_span(span, x) for span in phases if span.is_backlog),
        _interval_line(history.checkpoints, history.interval_changes, x),
        time_axis(x, BOTTOM),
        *(_checkpoint(c, x, most_rows) for c in history.checkpoints),
        *(_boundary(mark, x) for mark in marks),
    ]
    for n, change in enumerate(history.transitions, 1):
        at_x = x(change.at)
        phase = "backlog" if change.is_backlog else "live"
        parts.append(
            element(
                "g",
                {"class": f"transition {phase}", "data-transition": str(n)},
                title(f"{n}. {fmt.utc(change.at)}, run {change.run_id}: {phase}: {change.reason}"),
                _vertical(at_x, "transition"),
                element("text", {"class": "tick", "x": at_x, "y": TOP - 16}, str(n)),
            )
        )
    for request in history.requests:
        at_x = x(request.requested_at)
        answer = f": {request.answer}" if request.answer else ""
        parts.append(
            element(
                "g",
                {"class": f"request {request.status}", "data-request": request.action},
                title(
                    f"{fmt.utc(request.requested_at)}: {request.action} {request.settings}, "
                    f"{request.status}{answer}"
                ),
                element("path", {"d": f"M{number(at_x)},{number(TOP - 26)}l6,6l-6,6l-6,-6z"}),
            )
        )
    return chart("timeline", WIDTH, BOTTOM + 36, f"timeline of job {history.job_name}", *parts)

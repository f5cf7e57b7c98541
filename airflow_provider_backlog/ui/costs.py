"""Where each checkpoint's time goes, and the state it carries: the case FLIP-309 rests on.

Every checkpoint pays a fixed cost whatever its data (asking for offsets, planning, writing
the offset and commit logs, Spark's own bookkeeping); only ``add_batch`` is data work. A
bar per checkpoint stacks the two, so a reader sees how much of a phase's time its
checkpoints cost, and the medians per phase say it in numbers. Rows of an older release
have no parts: their bars are drawn as unknown, never as zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from statistics import median

from markupsafe import Markup

from airflow_provider_backlog.hooks.metrics_values import FIXED_PARTS, Checkpoint
from airflow_provider_backlog.ui import fmt
from airflow_provider_backlog.ui.svg import (
    Scale,
    TimeScale,
    chart,
    element,
    number,
    time_axis,
    title,
)

WIDTH, LEFT, RIGHT, TOP, BOTTOM = 960.0, 72.0, 64.0, 12.0, 172.0
#: The most room a bar takes, so that a few checkpoints do not look like long ones.
WIDEST_BAR = 24.0
#: The bar's segments from the bottom up: the data work, then the fixed cost's parts.
SEGMENTS = ("add_batch_ms", *FIXED_PARTS, "other_ms")
LABELS = {
    "add_batch_ms": "data work (addBatch)",
    "latest_offset_ms": "latest offsets",
    "get_batch_ms": "get batch",
    "query_planning_ms": "query planning",
    "wal_commit_ms": "offset log (WAL)",
    "commit_offsets_ms": "commit log",
    "other_ms": "Spark's bookkeeping",
}
_UNKNOWN = "parts unknown: recorded by an older release, or rebuilt after a crash"


@dataclass(frozen=True)
class PhaseMedians:
    """The median checkpoint of one phase, over the checkpoints whose parts are known.

    :param phase: ``backlog`` or ``live``.
    :param checkpoints: The phase's checkpoints in the period.
    :param known: How many of them have their parts.
    :param duration_ms: Their median duration; None when none is known.
    :param fixed_ms: Their median fixed cost.
    :param data_ms: Their median data work.
    :param fixed_share: Their fixed cost over their whole duration, summed.
    """

    phase: str
    checkpoints: int
    known: int
    duration_ms: float | None
    fixed_ms: float | None
    data_ms: float | None
    fixed_share: float | None


def medians(checkpoints: tuple[Checkpoint, ...]) -> list[PhaseMedians]:
    """The medians of each phase the checkpoints were in, backlog first."""
    rows = []
    for phase, is_backlog in (("backlog", True), ("live", False)):
        mine = [c for c in checkpoints if c.is_backlog == is_backlog]
        if not mine:
            continue
        known = [c for c in mine if c.fixed_ms is not None]
        total = sum(c.batch_duration_ms for c in known)
        rows.append(
            PhaseMedians(
                phase=phase,
                checkpoints=len(mine),
                known=len(known),
                duration_ms=median(c.batch_duration_ms for c in known) if known else None,
                fixed_ms=median(c.fixed_ms or 0 for c in known) if known else None,
                data_ms=median(c.add_batch_ms or 0 for c in known) if known else None,
                fixed_share=sum(c.fixed_ms or 0 for c in known) / total if total else None,
            )
        )
    return rows


def _bar(checkpoint: Checkpoint, left: float, width: float, y: Scale) -> Markup:
    phase = "backlog" if checkpoint.is_backlog else "live"
    name = (
        f"batch {checkpoint.batch_id} of run {checkpoint.run_id}, "
        f"{fmt.utc(checkpoint.committed_at)} ({phase}): "
        f"{fmt.milliseconds(checkpoint.batch_duration_ms)}"
    )
    mark = {"data-checkpoint": f"{checkpoint.run_id}:{checkpoint.batch_id}"}
    strip = {"class": f"phase {phase}", "x": left, "width": width, "y": BOTTOM + 3, "height": 5.0}
    shapes = [element("rect", strip)]
    fixed = checkpoint.fixed_ms
    if fixed is None:
        top = y(checkpoint.batch_duration_ms)
        box = {"class": "unknown", "x": left, "width": width, "y": top, "height": BOTTOM - top}
        shapes.append(element("rect", box))
        mark["data-unknown"] = "true"
        return element("g", mark, title(f"{name}; {_UNKNOWN}"), *shapes)
    base = 0
    for segment in SEGMENTS:
        value = getattr(checkpoint, segment) or 0
        top, bottom = y(base + value), y(base)
        box = {"class": f"part {segment}", "x": left, "width": width, "y": top}
        shapes.append(element("rect", {**box, "height": bottom - top}))
        base += value
    parts = ", ".join(f"{LABELS[s]} {fmt.milliseconds(getattr(checkpoint, s))}" for s in SEGMENTS)
    text = (
        f"{name} = data work {fmt.milliseconds(checkpoint.add_batch_ms)} "
        f"+ fixed cost {fmt.milliseconds(fixed)} ({parts})"
    )
    return element("g", mark, title(text), *shapes)


def costs_chart(checkpoints: tuple[Checkpoint, ...], job_name: str) -> Markup:
    """A stacked bar per checkpoint, in commit order, on one duration scale."""
    longest = max((c.batch_duration_ms for c in checkpoints), default=0)
    y = Scale(0, max(longest, 1), BOTTOM, TOP)
    step = min((WIDTH - RIGHT - LEFT) / max(len(checkpoints), 1), WIDEST_BAR)
    width = step - 1 if step > 4 else step
    bars = [_bar(c, LEFT + i * step, width, y) for i, c in enumerate(checkpoints)]
    axis = [
        element("text", {"class": "tick end", "x": LEFT - 6, "y": y(v) + 4}, fmt.milliseconds(v))
        for v in (0, longest)
    ]
    label = element(
        "text",
        {"class": "tick start", "x": LEFT, "y": BOTTOM + 22},
        "checkpoints in commit order; the strip below each bar is its phase",
    )
    return chart(
        "costs",
        WIDTH,
        BOTTOM + 30,
        f"where the checkpoints' time of job {job_name} went",
        *bars,
        *axis,
        label,
    )


def _line(points: list[tuple[float, float] | None], css: str) -> Markup:
    """A path through ``points``, broken where one is unknown (None)."""
    path, pen_down = [], False
    for point in points:
        if point is None:
            pen_down = False
            continue
        path.append(f"{'L' if pen_down else 'M'}{number(point[0])},{number(point[1])}")
        pen_down = True
    return element("path", {"class": css, "d": "".join(path)})


def state_chart(
    checkpoints: tuple[Checkpoint, ...], since: datetime, until: datetime, job_name: str
) -> Markup | None:
    """The state's size on disk (left axis) and its rows (right axis) from ``since`` to
    ``until``, a point per checkpoint; None when no checkpoint knows its state."""
    x = TimeScale(since, until, LEFT, WIDTH - RIGHT)
    marks = []
    for column, css, side, show in (
        ("state_disk_bytes", "state-disk", LEFT - 6, fmt.size),
        ("state_rows_total", "state-rows", WIDTH - RIGHT + 6, fmt.count),
    ):
        values = [getattr(c, column) for c in checkpoints]
        if all(v is None for v in values):
            continue
        y = Scale(0, max(v for v in values if v is not None) or 1, BOTTOM, TOP)
        points = [
            None if v is None else (x(c.committed_at), y(v))
            for c, v in zip(checkpoints, values, strict=True)
        ]
        marks.append(_line(points, css))
        marks += [
            element(
                "circle",
                {
                    "class": css,
                    "data-state": f"{c.run_id}:{c.batch_id}",
                    "cx": p[0],
                    "cy": p[1],
                    "r": 2.0,
                },
                title(
                    f"batch {c.batch_id} of run {c.run_id}, {fmt.utc(c.committed_at)}: {show(v)}"
                ),
            )
            for c, v, p in zip(checkpoints, values, points, strict=True)
            if p is not None
        ]
        anchor = "tick end" if side < LEFT else "tick start"
        marks += [
            element("text", {"class": f"{anchor} {css}", "x": side, "y": y(v) + 4}, show(v))
            for v in (0, y.high)
        ]
    if not marks:
        return None
    label = f"state of job {job_name} over time"
    return chart("state", WIDTH, BOTTOM + 36, label, *marks, time_axis(x, BOTTOM))

"""Inline SVG, written as text: charts need no JavaScript and no image files, scale with the
page, take their colours from the page's CSS (so a dark theme applies), and carry a
``<title>`` per mark that the browser shows as a tooltip.

Every attribute value and text is escaped here, since job names, reasons and answers come
from the database.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from markupsafe import Markup, escape

#: Steps between time ticks, in seconds (then whole days): the smallest that gives at most
#: ``MAX_TICKS``.
_TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)
MAX_TICKS = 8
_DAY = 86_400


def number(value: float) -> str:
    """A coordinate, to a tenth of a pixel: enough on screen, and short."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def element(name: str, attributes: Mapping[str, object] | None = None, *children: str) -> Markup:
    """``<name attributes>children</name>``; None attributes are left out, floats rounded,
    plain strings among the children escaped (``Markup`` ones are kept)."""
    written = "".join(
        f' {key}="{escape(number(value) if isinstance(value, float) else value)}"'
        for key, value in (attributes or {}).items()
        if value is not None
    )
    inner = "".join(str(escape(child)) for child in children)
    return Markup(f"<{name}{written}>{inner}</{name}>")


def title(text: str) -> Markup:
    """A tooltip for the element it is the first child of."""
    return element("title", None, text)


def chart(id: str, width: float, height: float, label: str, *children: str) -> Markup:
    """An ``<svg>`` that scales to its container's width, with ``label`` for screen readers."""
    return element(
        "svg",
        {
            "id": id,
            "class": "chart",
            "viewBox": f"0 0 {number(width)} {number(height)}",
            "role": "img",
            "aria-label": label,
        },
        *children,
    )


@dataclass(frozen=True)
class Scale:
    """A linear map from values to pixels.

    :param low: The value drawn at ``start``.
    :param high: The value drawn at ``end``; equal to ``low``, every value is drawn midway.
    :param start: The pixel of ``low``.
    :param end: The pixel of ``high``.
    """

    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        if self.high == self.low:
            return (self.start + self.end) / 2
        return self.start + (value - self.low) / (self.high - self.low) * (self.end - self.start)


@dataclass(frozen=True)
class TimeScale:
    """A linear map from times to pixels.

    :param since: The time drawn at ``start``.
    :param until: The time drawn at ``end``.
    :param start: The pixel of ``since``.
    :param end: The pixel of ``until``.
    """

    since: datetime
    until: datetime
    start: float
    end: float

    def __call__(self, at: datetime) -> float:
        scale = Scale(self.since.timestamp(), self.until.timestamp(), self.start, self.end)
        return scale(at.timestamp())

    def ticks(self) -> list[tuple[datetime, str]]:
        """Round times to mark on the axis, at most ``MAX_TICKS``, with their labels."""
        span = (self.until - self.since).total_seconds()
        step = next((s for s in _TICK_STEPS if span / s <= MAX_TICKS), None)
        if step is None:
            step = _DAY * math.ceil(span / (_DAY * MAX_TICKS))
        first = math.ceil(self.since.timestamp() / step) * step
        ticks = []
        at = datetime.fromtimestamp(first, UTC)
        while at <= self.until:
            ticks.append((at, at.strftime(_tick_format(step, span))))
            at += timedelta(seconds=step)
        return ticks


def _tick_format(step: float, span: float) -> str:
    if span > _DAY:
        return "%m-%d %H:%M"
    return "%H:%M:%S" if step < 60 else "%H:%M"


def time_axis(scale: TimeScale, y: float) -> Markup:
    """Ticks and labels of ``scale`` along a line at ``y``, marked as UTC."""
    marks = [
        element("line", {"class": "axis", "x1": scale.start, "x2": scale.end, "y1": y, "y2": y})
    ]
    for at, label in scale.ticks():
        x = scale(at)
        marks.append(element("line", {"class": "axis", "x1": x, "x2": x, "y1": y, "y2": y + 4.0}))
        marks.append(element("text", {"class": "tick", "x": x, "y": y + 16.0}, label))
    marks.append(element("text", {"class": "tick end", "x": scale.end, "y": y + 30.0}, "UTC"))
    return Markup("").join(marks)

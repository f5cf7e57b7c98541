"""How the pages write times, durations, sizes and ids: UTC in ISO form, so a time reads the
same to everyone whatever their browser's zone, durations in the largest units that keep
them short (``350 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 5 min``), and long ids in pieces a
table cell may wrap between."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup

_UNITS = ((86_400, "d"), (3_600, "h"), (60, "min"), (1, "s"))
_SIZES = ("B", "KiB", "MiB", "GiB", "TiB")
#: The most characters of an id a table cell keeps on one line.
ID_PIECE = 16


def utc(at: datetime | None) -> str:
    """``2026-11-21T12:00:05Z``; an empty string for None."""
    if at is None:
        return ""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """A duration in its two largest units (under 10 s, in ms or tenths of seconds); an
    empty string for None."""
    if seconds is None:
        return ""
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f} ms"
    if seconds < 10:
        return f"{sign}{seconds:.1f} s"
    whole = round(seconds)
    index = next(i for i, (size, _) in enumerate(_UNITS) if whole >= size)
    size, unit = _UNITS[index]
    major, rest = divmod(whole, size)
    text = f"{sign}{major} {unit}"
    if index + 1 < len(_UNITS):
        smaller, small_unit = _UNITS[index + 1]
        if minor := rest // smaller:
            text += f" {minor} {small_unit}"
    return text


def milliseconds(value: float | None) -> str:
    """A duration given in milliseconds; an empty string for None."""
    return "" if value is None else duration(value / 1000)


def count(value: float | None) -> str:
    """``12,345``; an empty string for None."""
    return "" if value is None else f"{value:,.0f}"


def size(value: float | None) -> str:
    """Bytes in binary units: ``512 B``, ``1.5 MiB``; an empty string for None."""
    if value is None:
        return ""
    exponent = 0
    while abs(value) >= 1024 and exponent < len(_SIZES) - 1:
        value, exponent = value / 1024, exponent + 1
    return f"{value:.0f} B" if exponent == 0 else f"{value:.1f} {_SIZES[exponent]}"


def share(part: float | None) -> str:
    """A fraction as a percentage: ``42%``; an empty string for None."""
    return "" if part is None else f"{part * 100:.0f}%"


def breakable(text: str) -> Markup:
    """``text`` escaped, with a line break allowed after every ``ID_PIECE`` characters: a
    run id (32 hex digits) would otherwise widen its table, and the page, past a narrow
    frame. Breaks only there, so that a cell never wraps an id after each character."""
    return Markup("<wbr>").join(text[i : i + ID_PIECE] for i in range(0, len(text), ID_PIECE))

"""Values as users write them: durations (``500ms``, ``30s``, ``30min``, ``1h``) and counts."""

from __future__ import annotations

import argparse
import math
import re

_UNITS_S = {
    "ms": 0.001,
    "milli": 0.001,
    "millis": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$")

DURATION_FORMAT = "a number with a unit, such as 500ms, 30s, 30min, 1h or 1d (or 0)"


def parse_duration(text: str, *, minimum_s: float = 0.0, maximum_s: float | None = None) -> float:
    """Return the duration in seconds; raise ValueError naming the accepted format or range.

    A bare number is accepted only for zero: ``30`` could mean milliseconds (Flink)
    or seconds (Spark triggers), so we make the user say which. A number too large for a
    float (``"9" * 400 + "s"``) is refused rather than read as an endless duration.
    """
    match = _PATTERN.match(text.lower())
    if not match:
        raise ValueError(f"expected {DURATION_FORMAT}")
    number, unit = float(match.group(1)), match.group(2)
    if not unit and number != 0:
        raise ValueError(f"a unit is required; expected {DURATION_FORMAT}")
    if unit and unit not in _UNITS_S:
        raise ValueError(f"unknown unit {unit!r}; expected {DURATION_FORMAT}")
    seconds = number * _UNITS_S[unit] if unit else 0.0
    if not math.isfinite(seconds) and maximum_s is None:
        raise ValueError(f"the number is too large; expected {DURATION_FORMAT}")
    if seconds < minimum_s or (maximum_s is not None and not seconds <= maximum_s):
        raise ValueError(duration_range(minimum_s, maximum_s))
    return seconds


def duration_range(minimum_s: float, maximum_s: float | None) -> str:
    """What a bounded duration may be, as errors and the configuration page say it."""
    rules = [f"at least {format_duration(minimum_s)}"] if minimum_s > 0 else []
    if maximum_s is not None:
        rules.append(f"at most {format_duration(maximum_s)}")
    return "must be " + " and ".join(rules)


def format_duration(seconds: float) -> str:
    """The shortest exact spelling, for messages and logs (``1.5s``, ``30min``)."""
    if seconds == 0:
        return "0"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    if seconds < 1:
        return f"{round(seconds * 1000, 3):g}ms"
    return f"{seconds:g}s"


def parse_count(text: str, *, zero_allowed: bool = False, maximum: int | None = None) -> int:
    """A whole number above zero (``_`` may group digits); ValueError says what is allowed.

    Only ASCII digits count (``int`` refuses ``²``, which ``str.isdigit`` accepts), and a
    number with more digits than ``int`` reads from text is refused with the same message.
    """
    rule = count_rule(zero_allowed=zero_allowed, maximum=maximum)
    digits = text.strip().replace("_", "")
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(rule)
    try:
        count = int(digits)
    except ValueError:  # more digits than sys.get_int_max_str_digits()
        raise ValueError(f"{rule}; {len(digits)} digits are too many") from None
    if count < (0 if zero_allowed else 1) or (maximum is not None and count > maximum):
        raise ValueError(rule)
    return count


def count_rule(*, zero_allowed: bool = False, maximum: int | None = None) -> str:
    """What a count may be, as errors and the configuration page say it."""
    rule = (
        "expected 0 or a whole number above 0"
        if zero_allowed
        else "expected a whole number above 0"
    )
    return rule if maximum is None else f"{rule}, at most {maximum:_}"


def processing_time(seconds: float) -> str:
    """A duration as ``DataStreamWriter.trigger(processingTime=...)`` takes it."""
    return f"{round(seconds * 1000)} milliseconds"


def duration_argument(text: str) -> float:
    """``type=`` for an argparse option that takes a duration."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None


def count_argument(text: str) -> int:
    """``type=`` for an argparse option that takes a whole number above 0."""
    try:
        return parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None

"""The live interval a freshness target allows: the largest that keeps live data fresh enough.

FLIP-309 leaves both intervals to the user, who wants something else: data no older than a
bound, at the fewest checkpoints. The job measures what decides that, so it can choose.

A live batch's freshness is its commit time minus the event time of its oldest input row,
where the query observes one; else minus the start of the batch before it, since none of
its rows can have arrived before that batch fixed its end offsets (an upper bound). Each
live batch also tells what its freshness would have been under another interval ``I``
than the one it ran under: a longer wait adds itself and the processing of the rows that
arrive meanwhile (``rate * cost`` per second); a shorter one is assumed to save only the
wait, since a batch's fixed cost does not shrink. The largest ``I`` that keeps a batch at
or under the target follows from its numbers, and the chosen interval is the 5th
percentile of those limits over recent batches: the p95 of freshness meets the target. A
change of rate or cost shows first in the latest batches, so the median of the last three
limits may shorten it sooner. A batch that starts late (the trigger's tick, the listener's
delay, a batch that ran longer than the interval) shows in its freshness, and so in the
choice. Shorter intervals are taken at once; longer ones at most double per batch, since
they are extrapolated; both aim 5% below what the target allows.

Pure, like the decider: it is given measurements and returns choices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spark_jobs.backlog.values import format_duration

#: Live batches the choice rests on: about 40 intervals, so the p95 is not just the worst.
WINDOW = 40
#: Live batches measured before the first choice that rests on them.
FIRST_MEASURED = 3
#: The latest batches whose median limit may shorten the interval before the window's p95
#: notices a change of rate or cost.
LATEST = 3
#: A chosen interval grows by at most this factor per batch (or this many seconds, from
#: an interval near zero).
MAX_GROWTH = 2.0
MAX_GROWTH_S = 0.5
#: The interval aims this far below what the target allows, so that a batch's noise does
#: not cross the target, and it grows only by this much at least (relative, and seconds):
#: it does not follow every batch's noise either.
HEADROOM = 0.95
GROWTH_STEP = 1.1
GROWTH_STEP_S = 0.1


@dataclass(frozen=True)
class LiveBatch:
    """One committed batch of live data, as the choice uses it (seconds).

    ``interval_s``: the live interval it was released under; ``gap_s``: from the previous
    batch's start to its own; ``freshness_s``: its commit minus its oldest row's event time
    (or the previous start); ``duration_s``: from its start to its commit.
    """

    interval_s: float
    gap_s: float
    freshness_s: float
    duration_s: float
    rows: int

    def largest_interval(self, target_s: float, seconds_per_row: float | None) -> float:
        """The interval at which this batch would have been exactly ``target_s`` old."""
        slack = target_s - self.freshness_s
        growth = self._growth(seconds_per_row) if slack > 0 else 1.0
        return self.interval_s + slack / growth

    def freshness_at(self, interval_s: float, seconds_per_row: float | None) -> float:
        """This batch's freshness had the interval been ``interval_s``."""
        longer = interval_s - self.interval_s
        growth = self._growth(seconds_per_row) if longer > 0 else 1.0
        return self.freshness_s + longer * growth

    def _growth(self, seconds_per_row: float | None) -> float:
        """Seconds of freshness per second of a longer interval: the wait, and the rows it
        brings. Without a measured cost per row, the batch's own time per row stands in: it
        counts the fixed cost as if it grew with the rows, which errs towards shorter."""
        cost = self.duration_s / self.rows if seconds_per_row is None else seconds_per_row
        return 1.0 + cost * self.rows / self.gap_s


def live_batch(
    interval_s: float,
    started_at: float,
    committed_at: float,
    rows: int,
    previous_started_at: float | None,
    oldest_event_at: float | None,
) -> LiveBatch | None:
    """The measurement of a committed live batch; None when it says nothing about
    freshness (no rows, or no batch before it in this phase)."""
    if rows <= 0 or previous_started_at is None or started_at <= previous_started_at:
        return None
    oldest = previous_started_at if oldest_event_at is None else oldest_event_at
    return LiveBatch(
        interval_s=interval_s,
        gap_s=started_at - previous_started_at,
        freshness_s=committed_at - oldest,
        duration_s=max(committed_at - started_at, 0.0),
        rows=rows,
    )


@dataclass(frozen=True)
class Bounds:
    """Where the chosen interval may lie: from ``min-pause`` to ``interval`` (and never past
    the target, as a batch is at least one interval old)."""

    lowest_s: float
    highest_s: float

    def clamp(self, interval_s: float) -> float:
        return min(max(interval_s, self.lowest_s), self.highest_s)


@dataclass(frozen=True)
class IntervalChoice:
    """A live interval and why: the reason is recorded with every change."""

    interval_s: float
    reason: str
    #: False when even the shortest interval would not meet the target.
    meets_target: bool = True

    def differs_from(self, other: IntervalChoice | None) -> bool:
        """Whether this is a change to apply and record."""
        return (
            other is None
            or self.interval_s != other.interval_s
            or self.meets_target != other.meets_target
        )


class FreshnessWindow:
    """Recent live batches, and the interval they allow for a target."""

    def __init__(self, size: int = WINDOW) -> None:
        self._batches: deque[LiveBatch] = deque(maxlen=size)

    def observe(self, batch: LiveBatch) -> None:
        self._batches.append(batch)

    def choose(
        self,
        target_s: float,
        bounds: Bounds,
        current_s: float | None,
        seconds_per_row: float | None,
    ) -> IntervalChoice:
        """The largest interval within ``bounds`` whose p95 freshness meets ``target_s``."""
        target = format_duration(target_s)
        highest = min(bounds.highest_s, target_s)
        if len(self._batches) < FIRST_MEASURED:
            interval = Bounds(bounds.lowest_s, highest).clamp(target_s / 2)
            return IntervalChoice(
                interval,
                f"freshness target {target}: {_seconds(interval)} until {FIRST_MEASURED} live "
                "batches are measured",
            )
        limits = [b.largest_interval(target_s, seconds_per_row) for b in self._batches]
        latest = sorted(limits[-LATEST:])[len(limits[-LATEST:]) // 2]
        allowed = min(sorted(limits)[_worst_kept(len(limits))], latest)
        interval = _step(allowed, current_s)
        interval = Bounds(bounds.lowest_s, highest).clamp(interval)
        predicted = self._p95_at(interval, seconds_per_row)
        over = f"over the last {len(self._batches)} live batches"
        if allowed < bounds.lowest_s:
            return IntervalChoice(
                interval,
                f"freshness target {target} cannot be met: at the shortest interval "
                f"({_seconds(interval)}, min-pause) live data would be {_seconds(predicted)} "
                f"old at p95 {over}",
                meets_target=False,
            )
        cap = ""
        if allowed > highest:
            cap = ", at most interval" if bounds.highest_s <= target_s else ", at most the target"
        return IntervalChoice(
            interval,
            f"freshness target {target}: {_seconds(interval)} keeps p95 freshness at "
            f"{_seconds(predicted)} {over}{cap}",
        )

    def _p95_at(self, interval_s: float, seconds_per_row: float | None) -> float:
        return p95([b.freshness_at(interval_s, seconds_per_row) for b in self._batches])


def _step(allowed_s: float, current_s: float | None) -> float:
    """The next interval from the current one, towards a little less than the target allows."""
    aim = allowed_s * HEADROOM
    if current_s is None or allowed_s < current_s:
        return aim
    if aim >= max(current_s * GROWTH_STEP, current_s + GROWTH_STEP_S):
        return min(aim, max(current_s * MAX_GROWTH, current_s + MAX_GROWTH_S))
    return current_s


def _worst_kept(count: int) -> int:
    """How many of ``count`` batches the p95 may leave above the target."""
    return int(0.05 * count)


def p95(values: Sequence[float]) -> float:
    """The p95 as the target judges it: the worst value once ``_worst_kept`` are left out."""
    ordered = sorted(values)
    return ordered[len(ordered) - 1 - _worst_kept(len(ordered))]


def _seconds(value: float) -> str:
    return f"{value:.2f}s"


#: The observation (``DataFrame.observe``) whose ``min_ms`` is a batch's oldest event time
#: in epoch milliseconds: a query that makes it has its freshness measured by event time.
EVENT_TIME_OBSERVATION = "event_time"
OLDEST_EVENT_MS = "min_ms"


def oldest_event_at(observed_metrics: Mapping[str, Any]) -> float | None:
    """A batch's oldest event time (epoch seconds) from its observed metrics, if it has one."""
    observation = observed_metrics.get(EVENT_TIME_OBSERVATION)
    value = observation.get(OLDEST_EVENT_MS) if isinstance(observation, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value / 1000

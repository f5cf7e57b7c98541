"""Two ways to make a running query follow the decider.

Source-gated (no restart): this project's Python sources ask the published plan before
every batch. Restart-based: Spark's built-in sources cannot be asked, so the query is
stopped and started again from the same checkpoint with another trigger and per-trigger
limit (measured gap 0.6-1.8 s; a new limit applies one batch late).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.lag import OFFSETS_BEHIND_LATEST
from spark_jobs.backlog.plan import STALE_GRACE_S, TriggerPlan, share_rows
from spark_jobs.backlog.status import SourceStatus
from spark_jobs.backlog.values import processing_time
from spark_jobs.coordinator.coordinator import StatusProbe
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.sources.gate import PlanChannel

#: A backlog limit this many times above the current one is worth a restart; shrinking
#: needs a larger factor, since a restart near the end of the backlog is mostly waste.
GROW_FACTOR = 2.0
SHRINK_FACTOR = 4.0


class SourceGatedApplier:
    """Publishes each decision as a numbered plan for the gated sources to follow.

    The decided rows bound the whole batch: with several gated sources in one query each
    gets its share (``share_rows``), sized by what it had waiting after the last batch.
    ``sources`` names the gated sources known before any batch (from the query's plan), so
    that even the first batch is shared.
    """

    def __init__(self, channel: PlanChannel, config: BacklogConfig, sources: Iterable[str] = ()):
        self._channel = channel
        self._stale_after_s = config.interval_s + STALE_GRACE_S
        self._seq = 0
        self._demands: dict[str, int | None] = dict.fromkeys(sources)

    def reconfigure(self, config: BacklogConfig) -> None:
        self._stale_after_s = config.interval_s + STALE_GRACE_S

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None:
        starts = None
        if progress is not None:
            starts = {}
            for source in progress.sources:
                status = source.hybrid_status()
                if status is not None:
                    starts[status.name] = source.end_offset
                    self._demands[status.name] = _waiting_rows(status, source.num_input_rows)
        budgets = share_rows(decision.max_rows, self._demands) if len(self._demands) > 1 else None
        self._seq += 1
        self._channel.publish(
            TriggerPlan.from_decision(self._seq, decision, self._stale_after_s, starts, budgets)
        )


def _waiting_rows(status: SourceStatus, last_batch_rows: int) -> int | None:
    """Rows a source has waiting, as it reported them (None: it cannot tell), and at least
    as many as its last batch took: a live source will have about that many again."""
    if status.finished:
        return 0
    waiting = status.lag.get("rows_behind", status.lag.get(OFFSETS_BEHIND_LATEST))
    return None if waiting is None else max(int(waiting), last_batch_rows, 1)


class BatchLimits(Protocol):
    """How to cap one batch of a built-in source, which Spark sizes in its own units: the
    reader options (``maxFilesPerTrigger``...) for a batch of about ``max_rows`` rows."""

    def limit_options(self, max_rows: int) -> dict[str, str]: ...


class RestartProbe(StatusProbe, BatchLimits, Protocol):
    """What restart-based mode needs of a built-in source: its status and its batch cap."""


@dataclass(frozen=True)
class TriggerSettings:
    """What a restart-based query is started with: its trigger, and the reader options
    that cap its batches (none live)."""

    is_backlog: bool
    processing_time_s: float
    source_options: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def trigger(self) -> dict[str, str]:
        """Keyword arguments for ``DataStreamWriter.trigger``."""
        return {"processingTime": processing_time(self.processing_time_s)}


class RestartApplier:
    """Turns decisions into trigger settings and asks for a restart when they change.

    Backlog: back to back (trigger 0, or min-pause as the trigger, which Spark measures
    start to start), each batch capped by the source for the decided rows. Real time:
    trigger ``interval`` with no limit. The restart itself happens on the thread that owns
    the query.
    """

    def __init__(self, config: BacklogConfig, limits: BatchLimits):
        self._config = config
        self._limits = limits
        self._lock = threading.Lock()
        self.current: TriggerSettings | None = None
        self._wanted: TriggerSettings | None = None

    def reconfigure(self, config: BacklogConfig) -> None:
        """The next decision's settings use the new intervals (a restart if they differ)."""
        self._config = config

    def settings_for(self, decision: Decision) -> TriggerSettings:
        if not decision.is_backlog:
            # Everything that arrived: a limit here would let live data pile up again. The
            # interval is the decision's: a freshness target chooses it.
            interval = (
                self._config.interval_s if decision.interval_s is None else decision.interval_s
            )
            return TriggerSettings(False, interval)
        options = self._limits.limit_options(decision.max_rows)
        return TriggerSettings(True, self._config.min_pause_s, options)

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None:
        del progress  # the restart rebuilds the query from the checkpoint
        wanted = self.settings_for(decision)
        with self._lock:
            if self.current is None or self._worth_restart(self.current, wanted):
                self._wanted = wanted

    def _worth_restart(self, current: TriggerSettings, wanted: TriggerSettings) -> bool:
        """Another mode, trigger or kind of limit always is; the same limit (a count) only
        when it grows or shrinks enough."""
        old, new = current.source_options, wanted.source_options
        if (current.is_backlog, current.processing_time_s, old.keys()) != (
            wanted.is_backlog,
            wanted.processing_time_s,
            new.keys(),
        ):
            return True
        return any(
            int(new[key]) >= int(old[key]) * GROW_FACTOR
            or int(new[key]) * SHRINK_FACTOR <= int(old[key])
            for key in new
        )

    def take_restart(self) -> TriggerSettings | None:
        """Settings to restart with, once; None when the query should keep running as is."""
        with self._lock:
            wanted, self._wanted = self._wanted, None
            if wanted is not None:
                self.current = wanted
            return wanted


class RecordOnlyApplier:
    """Leaves the query alone: for measuring a hand-set static trigger with the same records."""

    def reconfigure(self, config: BacklogConfig) -> None:
        del config  # the hand-set trigger stays what it was started with

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None:
        del decision, progress

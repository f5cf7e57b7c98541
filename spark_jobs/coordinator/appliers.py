"""Two ways to make a running query follow the decider.

Source-gated (no restart): this project's Python sources ask the published plan before
every batch. Restart-based: Spark's built-in sources cannot be asked, so the query is
stopped and started again from the same checkpoint with another trigger and per-trigger
limit (measured gap 0.6-1.8 s; a new limit applies one batch late).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from spark_jobs.backlog.config import BacklogConfig
from spark_jobs.backlog.decider import Decision
from spark_jobs.backlog.plan import STALE_GRACE_S, TriggerPlan
from spark_jobs.backlog.values import processing_time
from spark_jobs.coordinator.progress import BatchProgress
from spark_jobs.sources.gate import PlanChannel

#: Files in the first backlog batch of a file-source query, before rows per file are known.
PROBE_FILES = 10
#: A backlog limit this many times above the current one is worth a restart; shrinking
#: needs a larger factor, since a restart near the end of the backlog is mostly waste.
GROW_FACTOR = 2.0
SHRINK_FACTOR = 4.0


class SourceGatedApplier:
    """Publishes each decision as a numbered plan for the gated sources to follow."""

    def __init__(self, channel: PlanChannel, config: BacklogConfig):
        self._channel = channel
        self._stale_after_s = config.interval_s + STALE_GRACE_S
        self._seq = 0

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None:
        starts = None
        if progress is not None:
            starts = {
                str(source.end_offset["source"]): source.end_offset
                for source in progress.sources
                if source.hybrid_status() is not None
            }
        self._seq += 1
        self._channel.publish(
            TriggerPlan.from_decision(self._seq, decision, self._stale_after_s, starts)
        )


@dataclass(frozen=True)
class TriggerSettings:
    """What a restart-based query is started with."""

    is_backlog: bool
    processing_time_s: float
    max_files_per_trigger: int | None

    @property
    def trigger(self) -> dict[str, str]:
        """Keyword arguments for ``DataStreamWriter.trigger``."""
        return {"processingTime": processing_time(self.processing_time_s)}

    @property
    def source_options(self) -> dict[str, str]:
        if self.max_files_per_trigger is None:
            return {}
        return {"maxFilesPerTrigger": str(self.max_files_per_trigger)}


class RestartApplier:
    """Turns decisions into trigger settings and asks for a restart when they change.

    Backlog: back to back (trigger 0, or min-pause as the trigger, which Spark measures
    start to start), files per trigger sized from the decided rows. Real time: trigger
    ``interval`` with no limit. The restart itself happens on the thread that owns the
    query.
    """

    def __init__(self, config: BacklogConfig, rows_per_file: Callable[[], float | None]):
        self._config = config
        self._rows_per_file = rows_per_file
        self._lock = threading.Lock()
        self.current: TriggerSettings | None = None
        self._wanted: TriggerSettings | None = None

    def settings_for(self, decision: Decision) -> TriggerSettings:
        if not decision.is_backlog:
            # Everything that arrived: a limit here would let live data pile up again.
            return TriggerSettings(False, self._config.interval_s, None)
        per_file = self._rows_per_file()
        files = PROBE_FILES if per_file is None else math.floor(decision.max_rows / per_file)
        return TriggerSettings(True, self._config.min_pause_s, max(1, files))

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None:
        del progress  # the restart rebuilds the query from the checkpoint
        wanted = self.settings_for(decision)
        with self._lock:
            if self.current is None or self._worth_restart(self.current, wanted):
                self._wanted = wanted

    def _worth_restart(self, current: TriggerSettings, wanted: TriggerSettings) -> bool:
        if (current.is_backlog, current.processing_time_s) != (
            wanted.is_backlog,
            wanted.processing_time_s,
        ):
            return True
        if not wanted.is_backlog:
            return False
        old, new = current.max_files_per_trigger or 1, wanted.max_files_per_trigger or 1
        return new >= old * GROW_FACTOR or new * SHRINK_FACTOR <= old

    def take_restart(self) -> TriggerSettings | None:
        """Settings to restart with, once; None when the query should keep running as is."""
        with self._lock:
            wanted, self._wanted = self._wanted, None
            if wanted is not None:
                self.current = wanted
            return wanted


class RecordOnlyApplier:
    """Leaves the query alone: for measuring a hand-set static trigger with the same records."""

    def apply(self, decision: Decision, progress: BatchProgress | None = None) -> None:
        del decision, progress

"""The channel from the driver's coordinator to the sources in Spark's planner process.

They share no memory (the planner is a separate Python process started by the JVM, on
the driver's host), so the coordinator publishes its current ``TriggerPlan`` as a small
file that sources read whenever Spark asks them for an offset.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spark_jobs.backlog.plan import TriggerPlan

PLAN_FILE = "plan.json"


class PlanChannel:
    """One directory, one file: the latest plan, replaced atomically."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)

    def publish(self, plan: TriggerPlan) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, prefix=".plan-")
        with os.fdopen(descriptor, "w") as handle:
            handle.write(plan.to_json())
        os.replace(temporary, self.directory / PLAN_FILE)

    def read(self) -> TriggerPlan | None:
        """The latest plan (a few hundred bytes, read whole each time: no stale cache)."""
        try:
            return TriggerPlan.from_json((self.directory / PLAN_FILE).read_text())
        except FileNotFoundError:
            return None


class SourceGate:
    """Applies the published plan to one source: when it may release a batch, and how big."""

    def __init__(self, channel: PlanChannel, clock: Callable[[], float] = time.time):
        self._channel = channel
        self._clock = clock
        self._plan: TriggerPlan | None = None
        self._released_seq: int | None = None
        self._waiting_at: dict[str, Any] | None = None
        self._waiting_since = 0.0

    def allowed_rows(self, start: dict[str, Any]) -> int | None:
        """Rows the batch from ``start`` may take, or None when it may not start now."""
        plan = self._channel.read()
        if plan is None:
            raise RuntimeError(
                f"no trigger plan in {self._channel.directory}: the source option "
                "'backlogChannel' must name the channel of a running backlog coordinator"
            )
        now = self._clock()
        if start != self._waiting_at:
            self._waiting_at, self._waiting_since = start, now
        self._plan = plan
        if plan.releases(now, start, self._released_seq, self._waiting_since):
            return plan.max_rows
        return None

    def mark_released(self) -> None:
        """Record that a batch started under the plan last read."""
        if self._plan is not None:
            self._released_seq = self._plan.seq
